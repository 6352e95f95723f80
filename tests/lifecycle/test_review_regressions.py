"""Regressions found in review: each test failed before its fix."""

from __future__ import annotations

import tempfile
from typing import Any

import redis

from flowlang.compiler import compile_text
from flowlang.machine import Machine, State
from flowlang.runner import TaskCall, run
from lifecycle.audit.archive import read_archive
from lifecycle.audit.receipts import ReceiptsWorker
from lifecycle.audit.segments import SegmentSink
from lifecycle.engine.advance import Advancer
from lifecycle.engine.store import load_workflow
from lifecycle.keys import Keys
from lifecycle.submit import start_workflow, terminate_workflow
from tests.lifecycle.harness import Harness, decode

KEYS = Keys()


def read_one(client: redis.Redis, consumer: str) -> list[tuple[str, dict[str, Any]]]:
    reply = client.xreadgroup(KEYS.lifecycle_group, consumer, {KEYS.lifecycle: ">"}, count=1)
    return [(i.decode(), decode(f)) for _, entries in reply for i, f in entries]


def test_a_receipts_batch_interrupted_before_its_fsync_is_archived_later(redis_url) -> None:
    class DropsFirstGet(redis.Redis):
        failures = 1

        def get(self, name: Any) -> Any:
            if DropsFirstGet.failures:
                DropsFirstGet.failures -= 1
                raise redis.ConnectionError("connection reset (injected)")
            return super().get(name)

    client = DropsFirstGet.from_url(redis_url)
    client.flushdb()
    start_workflow(client, compile_text("A → B"), None, "wf-1", KEYS)
    directory = tempfile.mkdtemp()
    sink = SegmentSink(directory)
    ReceiptsWorker(client, sink, KEYS, block_ms=50, trim_every=None).run(idle_timeout=1.0)
    sink.close()
    kinds = [r["event"]["kind"] for _, r in read_archive(directory) if "stream" in r]
    assert kinds == ["start-workflow"]


def test_a_terminate_applied_before_its_start_creates_nothing_and_the_start_runs(
    redis_client,
) -> None:
    # lifecycle.client sends a terminate only for a workflow it finds in Redis; one that
    # arrives for an id with no record (deleted, removed, never started) must not leave
    # a record behind that blocks the id.
    redis_client.xgroup_create(KEYS.lifecycle, KEYS.lifecycle_group, id="0", mkstream=True)
    start_workflow(redis_client, compile_text("A → B"), None, "wf-1", KEYS)
    terminate_workflow(redis_client, "wf-1", "user cancelled", KEYS)
    start, terminate = read_one(redis_client, "w1"), read_one(redis_client, "w2")
    assert "no workflow" in Advancer(redis_client, KEYS).apply(terminate).rejected[0][1]
    assert not redis_client.exists(KEYS.workflow("wf-1"))
    Advancer(redis_client, KEYS).apply(start)
    assert load_workflow(redis_client, KEYS, "wf-1").status == "running"


def test_a_delayed_retry_due_after_the_workflow_failed_starts_nothing(harness: Harness) -> None:
    from lifecycle.engine.timers import timer_pump

    def task(call: TaskCall) -> Any:
        raise RuntimeError(f"{call.name} broke")

    harness.submit(compile_text("A (- {$retries: 1, $backoff: 60} -) | B"), workflow_id="wf")
    harness.pump(task)
    assert load_workflow(harness.client, KEYS, "wf").status == "failed"
    timer_pump(harness.client, KEYS).fire_due(2**62)
    harness.pump(task)
    starts = [decode(f)["name"] for _, f in harness.client.xrange(KEYS.tasks("default"))]
    assert sorted(starts) == ["A", "B"]


def test_a_task_on_a_cycle_gets_its_retries_in_every_round() -> None:
    calls: list[tuple[str, int]] = []

    def poll(call: TaskCall) -> Any:
        calls.append((call.name, call.attempt))
        if call.name == "Poll" and call.attempt % 2 == 1:
            raise RuntimeError("transient")
        return {}

    result = run(
        compile_text("Poll (- {$retries: 1} -) → Count → :start"), poll, retries=1, max_tasks=12
    )
    assert result.status == "running"  # never failed: each round's first failure is retried
    assert [a for n, a in calls if n == "Poll"] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_iterated_items_on_a_cycle_get_new_ids_and_stale_ends_are_ignored() -> None:
    machine, state = Machine(compile_text("L → *A → :start")), State()
    (first,) = machine.start(state)
    items = machine.task_ended(state, first.key, first.attempt, [1, 2])
    assert [(i.key, i.attempt) for i in items] == [("2.0", 1), ("2.1", 1)]
    machine.task_ended(state, "2.0", 1, {"round": 1})
    (again,) = machine.task_ended(state, "2.1", 1, {"round": 1})
    items = machine.task_ended(state, again.key, again.attempt, [1, 2])
    assert [(i.key, i.attempt) for i in items] == [("2.0", 2), ("2.1", 2)]
    assert machine.task_ended(state, "2.0", 1, {"stale": True}) == []
    assert state.running == {"2.0": 2, "2.1": 2}


def test_restarting_one_item_of_an_iterated_subflow_does_not_fan_out_again() -> None:
    machine, state = Machine(compile_text("L → *{ A → :start; B }")), State()
    (first,) = machine.start(state)
    machine.task_ended(state, first.key, first.attempt, [{"n": 1}, {"n": 2}])
    restarted = machine.task_ended(state, "3.0", 1, {"n": 1, "again": True})
    assert state.status == "running"
    assert sorted((a.key, a.name) for a in restarted) == [("3.0", "A"), ("4.0", "B")]
    assert all(a.input == {"n": 1, "again": True} for a in restarted)
