"""status --alive and --receipts: per-process probes for containers, cheap, exit 0/1."""

from __future__ import annotations

import socket
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis

from flowstream.cli import main
from lifecycle.cli import EXIT_FAILED, EXIT_OK
from lifecycle.keys import RECEIPTS_GROUP, Keys

KEYS = Keys()


def run(capsys: Any, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    assert captured.err == ""
    return code, captured.out


def test_alive_finds_the_workers_of_this_host_by_their_default_consumer_names(
    engine: Any, redis_url: str, capsys: Any
) -> None:
    time.sleep(0.3)  # the threads' first blocking reads create their consumers
    code, out = run(capsys, "status", "--alive", "--redis-url", redis_url, "--stale", "2")
    assert code == EXIT_OK
    assert out.startswith(f"alive: consumer {socket.gethostname()}-")


def test_no_consumer_of_that_name_is_not_alive(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    redis_client.xgroup_create(KEYS.lifecycle, KEYS.lifecycle_group, id="0", mkstream=True)
    redis_client.xreadgroup(KEYS.lifecycle_group, "lcx-1", {KEYS.lifecycle: ">"})
    code, out = run(capsys, "status", "--alive", "lc", "--redis-url", redis_url)
    assert code == EXIT_FAILED
    assert out == (
        "not alive: no consumer named lc or lc-... on the engine's streams (a worker of a "
        "kind no submitted flow has used yet: add --kind KIND)\n"
    )


def test_a_worker_of_a_kind_no_flow_used_yet_is_found_when_its_kind_is_named(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    redis_client.xgroup_create(KEYS.tasks("shop"), "workers", id="0", mkstream=True)
    redis_client.xreadgroup("workers", "shop-pod-1", {KEYS.tasks("shop"): ">"})
    assert not redis_client.exists(KEYS.kinds)  # workers do not register their kind
    code, _ = run(capsys, "status", "--alive", "shop-pod", "--redis-url", redis_url)
    assert code == EXIT_FAILED
    code, out = run(
        capsys, "status", "--alive", "shop-pod", "--kind", "shop", "--redis-url", redis_url
    )
    assert code == EXIT_OK
    assert out.startswith(f"alive: consumer shop-pod-1 of group workers on {KEYS.tasks('shop')}")


def test_a_worker_that_stopped_reading_is_not_alive_once_stale_and_alive_when_it_reads(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    redis_client.sadd(KEYS.kinds, "ml")
    redis_client.xgroup_create(KEYS.tasks("ml"), "workers", id="0", mkstream=True)
    redis_client.xreadgroup("workers", "ml-pod-1-77", {KEYS.tasks("ml"): ">"})
    time.sleep(0.6)
    code, out = run(
        capsys, "status", "--alive", "ml-pod", "--stale", "0.5", "--redis-url", redis_url
    )
    assert code == EXIT_FAILED
    assert out.startswith(
        f"not alive: consumer ml-pod-1-77 of group workers on {KEYS.tasks('ml')} last read "
    )
    redis_client.xreadgroup("workers", "ml-pod-1-77", {KEYS.tasks("ml"): ">"})
    code, out = run(
        capsys, "status", "--alive", "ml-pod", "--stale", "0.5", "--redis-url", redis_url
    )
    assert code == EXIT_OK


def test_alive_ignores_what_the_whole_status_warns_about(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    redis_client.xgroup_create(KEYS.lifecycle, KEYS.lifecycle_group, id="0", mkstream=True)
    redis_client.xreadgroup(KEYS.lifecycle_group, "lc-1", {KEYS.lifecycle: ">"})
    redis_client.xadd(f"{KEYS.lifecycle}:dead", {"reason": "rejected"})
    assert run(capsys, "status", "--redis-url", redis_url)[0] == EXIT_FAILED
    assert run(capsys, "status", "--alive", "lc", "--redis-url", redis_url)[0] == EXIT_OK


def test_receipts_probe_fails_while_entries_wait_unarchived_past_stale(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    code, out = run(capsys, "status", "--receipts", "--redis-url", redis_url)
    assert code == EXIT_FAILED
    assert out == (
        f"receipts behind: {KEYS.lifecycle}: no receipts group (has the receipts worker started?)\n"
    )
    redis_client.xgroup_create(KEYS.lifecycle, RECEIPTS_GROUP, id="0", mkstream=True)
    last = redis_client.xadd(KEYS.lifecycle, {"kind": b'"ping"'})
    assert run(capsys, "status", "--receipts", "--redis-url", redis_url)[0] == EXIT_OK
    time.sleep(0.6)
    code, out = run(capsys, "status", "--receipts", "--stale", "0.5", "--redis-url", redis_url)
    assert code == EXIT_FAILED
    assert out.startswith(f"receipts behind: {KEYS.lifecycle}: 1 entries not archived, the oldest ")
    redis_client.xgroup_setid(KEYS.lifecycle, RECEIPTS_GROUP, last)  # what the worker does
    code, out = run(capsys, "status", "--receipts", "--stale", "0.5", "--redis-url", redis_url)
    assert (code, out) == (EXIT_OK, "receipts: nothing waited longer than 0.5 s\n")


def test_an_empty_name_or_a_kind_without_alive_is_one_line(redis_url: str, capsys: Any) -> None:
    code = main(["status", "--alive", "", "--redis-url", redis_url])
    assert code == 2
    assert capsys.readouterr().err.strip().endswith("--alive '': expected a consumer name")
    code = main(["status", "--kind", "shop", "--redis-url", redis_url])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--kind goes with --alive (the kinds whose streams it looks at)")


def test_the_probes_run_as_the_documented_read_only_user_with_no_refusal(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    from tests.lifecycle.test_look_acl import PASSWORD, reader_rules, refusals

    redis_client.sadd(KEYS.kinds, "ml")
    redis_client.xgroup_create(KEYS.lifecycle, KEYS.lifecycle_group, id="0", mkstream=True)
    redis_client.xgroup_create(KEYS.lifecycle, RECEIPTS_GROUP, id="$")
    redis_client.xgroup_create(KEYS.tasks("ml"), "workers", id="0", mkstream=True)
    redis_client.xreadgroup("workers", "ml-pod-1", {KEYS.tasks("ml"): ">"})
    redis_client.execute_command("ACL", "SETUSER", "flowstream-reader", *reader_rules())
    redis_client.execute_command("ACL", "LOG", "RESET")
    parts = urlsplit(redis_url)
    url = urlunsplit(parts._replace(netloc=f"flowstream-reader:{PASSWORD}@{parts.netloc}"))
    try:
        assert run(capsys, "status", "--alive", "ml-pod", "--redis-url", url)[0] == EXIT_OK
        assert run(capsys, "status", "--receipts", "--redis-url", url)[0] == EXIT_OK
        assert refusals(redis_client) == []
    finally:
        redis_client.execute_command("ACL", "DELUSER", "flowstream-reader")
