"""At most N running workflows per concurrency key (run --concurrency-key K --max-running N).

Workflows past the limit wait ``queued`` and start in submission order when one of
the same key ends: it finishes, fails or is terminated. The admission and the release
are written in the commit of the workflow's start or end; replay agrees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from flowlang.compiler import compile_text
from flowlang.graph import Graph
from flowlang.runner import TaskCall
from lifecycle import records as rec
from lifecycle.audit.report import audit_archive
from lifecycle.cli import main
from lifecycle.client import Client
from lifecycle.engine.commit import Commit
from lifecycle.engine.gate import gate_command
from lifecycle.errors import NotAllowed
from lifecycle.keys import TASK_GROUP, Keys
from lifecycle.submit import BadConcurrency, graph_task_kinds, start_workflow
from tests.lifecycle.audit_helpers import archive_all
from tests.lifecycle.harness import Harness, ScriptOnly, admitted_workflows, decode

KEYS = Keys()
FLOW = compile_text("A → B")


def ok(call: TaskCall) -> Any:
    return {"done": call.name}


def submit(harness: Harness, workflow_id: str, most: int = 2, graph: Graph = FLOW) -> str:
    for kind in graph_task_kinds(graph) - harness.kinds:
        harness._group(KEYS.tasks(kind), TASK_GROUP)
        harness.kinds.add(kind)
    return start_workflow(
        harness.client, graph, None, workflow_id, KEYS, concurrency_key="k", max_running=most
    )


def first_starts(client: redis.Redis) -> list[str]:
    """The workflows in the order their first start-task was sent."""
    seen: list[str] = []
    for _, fields in client.xrange(KEYS.tasks("default")):
        workflow = decode(fields)["workflow"]
        if workflow not in seen:
            seen.append(workflow)
    return seen


def states(client: redis.Redis, *ids: str) -> list[str]:
    return [status.state if status else "-" for status in Client(client, KEYS).statuses(ids)]


def test_past_max_running_workflows_wait_queued_and_start_in_submission_order(
    harness: Harness,
) -> None:
    ids = [submit(harness, f"w{n}") for n in range(6)]
    harness.advance()  # every one queued; the first two admitted in the same commits
    assert states(harness.client, *ids) == ["running"] * 2 + ["queued"] * 4
    assert first_starts(harness.client) == ids[:2]
    most = 0
    for _ in range(200):
        shown = states(harness.client, *ids)
        most = max(most, shown.count("running"))
        if not harness.advance() + harness.work(ok):
            break
    assert states(harness.client, *ids) == ["finished"] * 6
    assert most == 2
    assert first_starts(harness.client) == ids
    assert harness.client.scard(KEYS.key_running("k")) == 0
    assert harness.client.zcard(KEYS.key_queue("k")) == 0


def test_a_place_is_released_when_a_workflow_fails_is_terminated_or_finishes(
    harness: Harness,
) -> None:
    client = Client(harness.client, KEYS)
    ids = [submit(harness, f"w{n}", most=1) for n in range(4)]
    harness.advance()
    harness.advance()
    assert states(harness.client, *ids) == ["running", "queued", "queued", "queued"]

    def fail(call: TaskCall) -> Any:
        raise RuntimeError("no")

    harness.work(fail)  # w0's A fails: w0 fails
    harness.advance()
    harness.advance()  # the admit-workflow its end wrote
    assert states(harness.client, *ids) == ["failed", "running", "queued", "queued"]
    client.terminate("w1")
    harness.advance()
    harness.advance()
    assert states(harness.client, *ids) == ["failed", "terminated", "running", "queued"]
    harness.pump(ok)
    assert states(harness.client, *ids) == ["failed", "terminated", "finished", "finished"]
    client.delete("w0")
    harness.advance()
    assert harness.client.scard(KEYS.key_running("k")) == 0
    assert first_starts(harness.client) == ids


def test_a_queued_workflow_terminated_never_starts_and_the_next_takes_its_turn(
    harness: Harness,
) -> None:
    client = Client(harness.client, KEYS)
    ids = [submit(harness, f"w{n}", most=1) for n in range(3)]
    harness.advance()
    harness.advance()
    with pytest.raises(NotAllowed, match="queued"):
        client.pause("w1")
    client.terminate("w1", reason="not wanted")
    harness.advance()
    assert states(harness.client, *ids) == ["running", "terminated", "queued"]
    assert harness.client.zrange(KEYS.key_queue("k"), 0, -1) == [b"w2"]
    harness.pump(ok)
    assert states(harness.client, *ids) == ["finished", "terminated", "finished"]
    assert "w1" not in first_starts(harness.client)


def test_a_restarted_workflow_waits_for_its_turn_again_and_replay_agrees(
    harness: Harness, tmp_path: Path
) -> None:
    client = Client(harness.client, KEYS)
    ids = [submit(harness, f"w{n}", most=1) for n in range(2)]
    harness.advance()
    harness.advance()
    client.terminate("w0")
    harness.advance()  # w1 admitted
    harness.advance()
    client.restart("w0")
    harness.advance()
    assert states(harness.client, *ids) == ["queued", "running"]
    harness.pump(ok)
    assert states(harness.client, *ids) == ["finished", "finished"]
    archive_all(harness.client, tmp_path / "archive")
    report = audit_archive(tmp_path / "archive", KEYS, client=harness.client)
    assert report.ok, report.first_problem
    assert {w.live for w in report.workflows} == {"equal"}


def test_bad_concurrency_options_are_refused_before_anything_is_sent(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(BadConcurrency, match="max running 0"):
        start_workflow(redis_client, FLOW, None, None, KEYS, concurrency_key="k", max_running=0)
    flow = tmp_path / "f.flow"
    flow.write_text("A → B\n")
    base = ["run", str(flow), "--redis-url", redis_url]
    assert main([*base, "--concurrency-key", "k"]) == 2
    assert main([*base, "--concurrency-key", "", "--max-running", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: --concurrency-key") for line in err)
    assert redis_client.xlen(KEYS.lifecycle) == 0
    assert main([*base, "--concurrency-key", "k", "--max-running", "1"]) == 0
    assert redis_client.xlen(KEYS.lifecycle) == 1


def test_the_script_path_admits_and_releases_as_the_transaction_path_does(
    harness: Harness,
) -> None:
    harness.advancer = ScriptOnly(harness.client, KEYS)
    ids = [submit(harness, f"w{n}") for n in range(5)]
    most = 0
    for _ in range(200):
        most = max(most, states(harness.client, *ids).count("running"))
        if not harness.advance() + harness.work(ok):
            break
    assert states(harness.client, *ids) == ["finished"] * 5
    assert most == 2
    assert first_starts(harness.client) == ids


def test_a_gate_whose_commit_lost_its_race_admits_and_releases_nothing(
    redis_client: redis.Redis,
) -> None:
    redis_client.sadd(KEYS.key_running("k"), "w0")
    redis_client.hset(KEYS.workflow("w1"), rec.VERSION, "4")  # another worker wrote 4
    commit = Commit(KEYS, "w1")
    commit.set(rec.VERSION, 5)  # what its commit would have written, had it won
    commit.leave("k", 1)
    gate = gate_command([commit])
    assert gate is not None
    assert redis_client.execute_command(*gate) == [0]
    assert redis_client.smembers(KEYS.key_running("k")) == {b"w0"}
    redis_client.hset(KEYS.workflow("w1"), rec.VERSION, "5")
    redis_client.sadd(KEYS.key_running("k"), "w1")
    assert redis_client.execute_command(*gate) == [0]  # nobody waits: none admitted
    assert redis_client.smembers(KEYS.key_running("k")) == {b"w0"}


def test_two_lifecycle_workers_admit_every_workflow_exactly_once(
    redis_client: redis.Redis, pool: redis.ConnectionPool, in_threads: Any
) -> None:
    from lifecycle.worker import LifecycleWorker
    from tests.conftest import wait_until
    from workers.noop import NoopWorker

    options = {"pool": pool, "handle_signals": False, "block_ms": 20}
    in_threads(*[LifecycleWorker(batch_size=4, **options) for _ in range(2)])
    in_threads(NoopWorker(["default"], **options))
    ids = [
        start_workflow(
            redis_client, FLOW, None, f"w{n:02}", KEYS, concurrency_key="k", max_running=3
        )
        for n in range(30)
    ]
    wait_until(
        lambda: states(redis_client, *ids) == ["finished"] * 30, timeout=30, what="all to finish"
    )
    admitted = admitted_workflows(redis_client, KEYS)
    # Each exactly once. (Not quite in submission order: two workers apply starts in
    # parallel, and a place free goes to the first start applied; the order of those
    # waiting is the harness tests'.)
    assert sorted(admitted) == ids
    assert redis_client.scard(KEYS.key_running("k")) == 0
    assert redis_client.zcard(KEYS.key_queue("k")) == 0


def test_recover_puts_lost_keyed_workflows_back_in_their_places(
    harness: Harness, tmp_path: Path
) -> None:
    from lifecycle.audit.recover import recover

    ids = [submit(harness, f"w{n}", most=1) for n in range(2)]
    harness.advance()
    harness.advance()  # w0 admitted and running, w1 queued
    archive_all(harness.client, tmp_path / "archive")
    for workflow in ids:  # Redis lost them, and the key's sets
        harness.client.delete(KEYS.workflow(workflow))
    harness.client.delete(KEYS.key_running("k"), KEYS.key_queue("k"))
    report = recover(harness.client, tmp_path / "archive", KEYS)
    assert sorted(report.restored) == ids
    assert states(harness.client, *ids) == ["running", "queued"]
    assert harness.client.smembers(KEYS.key_running("k")) == {b"w0"}
    assert harness.client.zrange(KEYS.key_queue("k"), 0, -1) == [b"w1"]
    harness.pump(ok)
    assert states(harness.client, *ids) == ["finished", "finished"]
