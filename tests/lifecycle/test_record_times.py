"""A task record's times are stored from the workflow's creation, and read back as times.

Records written before (the time itself) stay readable, so a workflow in flight across
an upgrade shows its whole history right.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import orjson

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall
from lifecycle import records as rec
from lifecycle.engine.store import load_workflow
from lifecycle.inspect import describe_workflow
from lifecycle.keys import Keys

from .harness import Harness

KEYS = Keys()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _fails_b(call: TaskCall) -> Any:
    if call.name == "B":
        raise RuntimeError("B broke")
    return call.input


def _records(harness: Harness, workflow_id: str) -> dict[str, Any]:
    raw = harness.client.hgetall(KEYS.workflow(workflow_id))
    return {
        name.decode(): orjson.loads(value)
        for name, value in raw.items()
        if name.startswith((rec.START_PREFIX.encode(), rec.END_PREFIX.encode()))
    }


def _shown_ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def test_task_records_hold_ms_since_creation_and_readers_give_the_times(
    harness: Harness,
) -> None:
    before = _now_ms()
    workflow_id = harness.submit(compile_text("A → B → C"), {"n": 1}, "wf-times")
    harness.pump(_fails_b)
    after = _now_ms()
    created = int(harness.client.hget(KEYS.workflow(workflow_id), rec.CREATED))
    stored = _records(harness, workflow_id)
    # A's start (at creation), A's end and B's start (the plain step), B's failure
    assert {"n:1", "o:1", "n:2", "o:2"} <= set(stored)
    for name, value in stored.items():
        offset = value[1] if name.startswith(rec.START_PREFIX) else value[0]
        assert 0 <= offset <= after - created, (name, value)
    assert stored["o:2"][1:4] == [False, None, "B broke"]
    loaded = load_workflow(harness.client, KEYS, workflow_id)
    shown = describe_workflow(harness.client, KEYS, workflow_id)
    for task in shown["tasks"]:
        if task["started"] is None:
            continue  # C never started
        key = task["key"]
        started, ended = loaded.starts[key][1], loaded.ends[key][0]
        assert before <= started <= ended <= after
        assert (started, ended) == (
            created + stored[f"n:{key}"][1],
            created + stored[f"o:{key}"][0],
        )
        assert abs(_shown_ms(task["started"]) - started) <= 1
        assert task["duration_ms"] == ended - started


def test_records_that_hold_the_time_itself_read_as_before_and_the_workflow_goes_on(
    harness: Harness,
) -> None:
    workflow_id = harness.submit(compile_text("A → B"), {"n": 1}, "wf-upgraded")
    harness.advance()  # A's start-task sent, its record written
    created = int(harness.client.hget(KEYS.workflow(workflow_id), rec.CREATED))
    # As a worker before relative times wrote it: the time itself.
    old_start = created
    harness.client.hset(KEYS.workflow(workflow_id), "n:1", orjson.dumps([1, old_start, {"n": 1}]))
    harness.pump(lambda call: call.input)
    loaded = load_workflow(harness.client, KEYS, workflow_id)
    assert loaded.status == rec.FINISHED
    assert loaded.starts["1"][1] == old_start
    assert old_start <= loaded.ends["1"][0] <= loaded.starts["2"][1] <= loaded.ends["2"][0]
    assert loaded.ends["2"][0] <= _now_ms()
    shown = {t["key"]: t for t in describe_workflow(harness.client, KEYS, workflow_id)["tasks"]}
    assert shown["1"]["duration_ms"] == loaded.ends["1"][0] - old_start
    assert abs(_shown_ms(shown["1"]["started"]) - old_start) <= 1


def test_a_workflow_whose_created_is_unreadable_goes_on_with_its_times_stored_whole(
    harness: Harness,
) -> None:
    workflow_id = harness.submit(compile_text("A → B"), {"n": 1}, "wf-damaged")
    harness.advance()  # A's start record: an offset from the creation
    harness.client.hset(KEYS.workflow(workflow_id), rec.CREATED, b"garbage")
    harness.pump(lambda call: call.input)
    loaded = load_workflow(harness.client, KEYS, workflow_id)
    assert loaded.status == rec.FINISHED and loaded.created is None
    # What was written after the damage holds the times themselves.
    assert before_now(loaded.ends["1"][0]) and before_now(loaded.starts["2"][1])
    # A's start is an offset from a creation no longer known: unknown, not 1970.
    assert loaded.starts["1"][1] is None
    shown = {t["key"]: t for t in describe_workflow(harness.client, KEYS, workflow_id)["tasks"]}
    assert shown["1"]["started"] is None and shown["1"]["duration_ms"] is None
    assert shown["2"]["duration_ms"] == loaded.ends["2"][0] - loaded.starts["2"][1]


def before_now(value: Any) -> bool:
    return type(value) is int and rec.RELATIVE_BELOW <= value <= _now_ms()
