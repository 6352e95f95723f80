"""Retention: workflows that ended leave Redis after their retention time, and only they."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall
from lifecycle.cli import main
from lifecycle.client import Client
from lifecycle.engine.advance import Advancer
from lifecycle.engine.retention import parse_duration, retention_pump
from lifecycle.errors import LifecycleError
from lifecycle.keys import Keys
from tests.conftest import wait_until
from tests.lifecycle.harness import Harness

KEYS = Keys()


def ok(call: TaskCall) -> Any:
    return {}


def broken(call: TaskCall) -> Any:
    raise RuntimeError("broke")


@pytest.fixture
def retaining(redis_client: redis.Redis) -> Harness:
    harness = Harness(redis_client, KEYS)
    harness.advancer = Advancer(redis_client, KEYS, retain_ms=60_000)
    return harness


def test_a_workflow_that_ends_is_scheduled_for_removal_after_its_retention(
    retaining: Harness,
) -> None:
    retaining.submit(compile_text("A → B"), workflow_id="wf")
    retaining.advance()
    assert retaining.client.zscore(KEYS.expiring, "wf") is None  # running: kept
    retaining.pump(ok)
    ended = int(retaining.client.hget(KEYS.workflow("wf"), "ended"))
    assert retaining.client.zscore(KEYS.expiring, "wf") == ended + 60_000


def test_the_pump_removes_only_what_is_due_with_its_index_entries(retaining: Harness) -> None:
    graph = compile_text("A")
    for n in range(50):
        retaining.submit(graph, workflow_id=f"w{n}")
    retaining.pump(ok)
    running = retaining.submit(compile_text("A → B"), workflow_id="still-running")
    retaining.advance()
    due = {f"w{n}": 1 for n in range(10)}  # ten of them are due now
    retaining.client.zadd(KEYS.expiring, due)
    removed = retention_pump(retaining.client, KEYS).fire_due()
    assert removed == 10
    assert not any(retaining.client.exists(KEYS.workflow(w)) for w in due)
    assert all(retaining.client.exists(KEYS.workflow(f"w{n}")) for n in range(10, 50))
    assert retaining.client.zcard(KEYS.workflows) == 41  # 40 kept + the running one
    assert retaining.client.zcard(KEYS.expiring) == 40
    assert Client(retaining.client, KEYS).status(running).state == "running"


def test_a_failed_workflow_has_a_stop_record_and_a_restart_takes_it_off_the_schedule(
    retaining: Harness,
) -> None:
    retaining.submit(compile_text("A"), workflow_id="wf")
    retaining.pump(broken)
    assert retaining.client.hexists(KEYS.stopped, "wf")
    assert retaining.client.zscore(KEYS.expiring, "wf") is not None
    Client(retaining.client, KEYS).restart("wf")
    retaining.advance()
    assert retaining.client.hexists(KEYS.stopped, "wf")  # its stopped attempt stays stopped
    assert retaining.client.zscore(KEYS.expiring, "wf") is None
    assert retaining.client.hget(KEYS.workflow("wf"), "ended") is None


def test_retention_zero_keeps_workflows_forever(harness: Harness) -> None:
    harness.submit(compile_text("A"), workflow_id="wf")
    harness.pump(ok)
    assert harness.client.zcard(KEYS.expiring) == 0


def test_a_lifecycle_worker_with_a_short_retention_empties_redis_of_ended_workflows(
    redis_client: redis.Redis, pool: redis.ConnectionPool, in_threads: Any
) -> None:
    from lifecycle.worker import LifecycleWorker
    from workers.noop import NoopWorker

    options = {"pool": pool, "handle_signals": False, "block_ms": 20}
    in_threads(LifecycleWorker(retain=0.3, **options), NoopWorker(["default"], **options))
    client = Client(redis_client, KEYS)
    for n in range(20):
        client.submit(compile_text("A → B"), {"n": n}, f"w{n}")
    wait_until(lambda: int(redis_client.hget(KEYS.outcomes, "finished") or 0) == 20)
    wait_until(lambda: redis_client.zcard(KEYS.workflows) == 0, timeout=10)
    assert not redis_client.keys(KEYS.workflow("*"))
    assert redis_client.zcard(KEYS.expiring) == 0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0), ("90", 90), ("500ms", 0.5), ("30s", 30), ("15m", 900), ("12h", 43200),
     ("7d", 604800), ("2w", 1209600)],
)  # fmt: skip
def test_durations_read_as_documented(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_bad_retention_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(LifecycleError, match="not a duration"):
        parse_duration("7 days")
    assert main(["worker", "--retain", "soon", "--redis-url", "redis://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--retain" in err
