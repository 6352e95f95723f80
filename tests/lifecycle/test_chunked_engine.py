"""Iterations and wide joins on the engine: their state stored entry by entry.

A workflow with an iteration (or more than a few dozen nodes) keeps a small core
in its record and one field per running task, open iteration, collected output
and join arrival; each batch reads and writes only those its events touch. These
tests run such workflows through the real advance (Redis, both commit paths) and
check what they end with and what their records hold on the way.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from flowlang.limits import Limits
from flowlang.runner import TaskCall, run
from lifecycle import records as rec
from lifecycle.audit.report import audit_archive
from lifecycle.cli.audit import replay_limits
from lifecycle.client import Client
from lifecycle.engine.advance import Advancer
from lifecycle.engine.store import load_workflow
from lifecycle.keys import Keys
from lifecycle.worker import LifecycleWorker
from tests.lifecycle.audit_helpers import archive_all
from tests.lifecycle.harness import Harness

KEYS = Keys()
ENTRY_PREFIXES = (b"r:", b"f:", b"i:", b"w:", b"a:")


def echo(call: TaskCall) -> Any:
    if call.name == "A":
        return call.input  # the list the next step iterates over
    return {"by": call.name, "of": call.input}


def fields(client: redis.Redis, workflow_id: str) -> dict[bytes, bytes]:
    return client.hgetall(KEYS.workflow(workflow_id))  # type: ignore[return-value]


def entries(client: redis.Redis, workflow_id: str) -> list[bytes]:
    return [name for name in fields(client, workflow_id) if name[:2] in ENTRY_PREFIXES]


def test_an_iteration_of_3000_items_ends_as_the_in_memory_runner_ends_it(
    harness: Harness,
) -> None:
    graph = compile_text("A → * { B → C } → D")
    items = [{"n": n} for n in range(3000)]
    record = harness.run(graph, echo, items)
    assert record.status == "finished"
    assert record.output == run(graph, echo, items).output
    assert entries(harness.client, record.id) == []  # nothing of the run is left behind


def test_a_running_iteration_keeps_a_small_core_and_one_field_per_running_item(
    harness: Harness,
) -> None:
    graph = compile_text("A → * B → C")
    workflow_id = harness.submit(graph, list(range(2000)))
    harness.advance()
    harness.work(echo)  # A ends: 2000 B start
    harness.advance()
    stored = fields(harness.client, workflow_id)
    core = orjson.loads(stored[rec.STATE.encode()])
    assert core["live"] == 2000 and len(stored[rec.STATE.encode()]) < 100
    assert sum(name.startswith(b"r:") for name in stored) == 2000
    assert orjson.loads(stored[b"f:2"]) == [2000, 2000]
    harness.pump(echo)
    assert load_workflow(harness.client, KEYS, workflow_id).output == {
        "by": "C",
        "of": [{"by": "B", "of": n} for n in range(2000)],
    }


def test_a_70_way_join_starts_its_successor_once_with_every_arrival_in_order(
    harness: Harness,
) -> None:
    graph = compile_text(" | ".join(f"T{n}" for n in range(70)) + " → J")
    record = harness.run(graph, echo, {"x": 1})
    assert record.status == "finished"
    assert record.output == run(graph, echo, {"x": 1}).output
    assert len(record.output["of"]) == 70
    assert entries(harness.client, record.id) == []


def test_terminating_an_iteration_stops_every_item_and_clears_its_running_fields(
    harness: Harness,
) -> None:
    graph = compile_text("A → * B → C")
    workflow_id = harness.submit(graph, list(range(500)))
    harness.advance()
    harness.work(echo)
    harness.advance()
    Client(harness.client, KEYS).terminate(workflow_id, "enough")
    harness.advance()
    record = load_workflow(harness.client, KEYS, workflow_id)
    assert record.status == "terminated"
    assert len(record.state.stopped) == 500
    assert not any(name.startswith(b"r:") for name in fields(harness.client, workflow_id))


def test_a_failed_item_fails_the_iteration_and_a_restart_runs_it_to_the_end(
    harness: Harness,
) -> None:
    graph = compile_text("A → * B → C")
    failing = {"on": True}

    def flaky(call: TaskCall) -> Any:
        if call.name == "B" and call.input == 7 and failing["on"]:
            raise RuntimeError("item 7 broke")
        return echo(call)

    workflow_id = harness.submit(graph, list(range(300)))
    harness.pump(flaky)
    record = load_workflow(harness.client, KEYS, workflow_id)
    assert record.status == "failed" and "item 7 broke" in (record.error or "")
    failing["on"] = False
    Client(harness.client, KEYS).restart(workflow_id)
    harness.pump(flaky)
    record = load_workflow(harness.client, KEYS, workflow_id)
    assert record.status == "finished"
    assert record.output == {"by": "C", "of": [{"by": "B", "of": n} for n in range(300)]}


def test_a_record_missing_an_entry_fails_its_workflow_alone_with_the_reason(
    harness: Harness,
) -> None:
    graph = compile_text("A → * B → C")
    broken = harness.submit(graph, list(range(100)), "broken")
    harness.advance()
    harness.work(echo)  # A ends
    harness.advance()  # 100 B start
    harness.work(echo)  # and end
    bystander = harness.submit(graph, list(range(100)), "bystander")
    # An output collected is lost from the record (an operator's HDEL, a bad restore).
    harness.client.hset(KEYS.workflow(broken), "f:2", b"[1,100]")
    harness.pump(echo)
    record = load_workflow(harness.client, KEYS, broken)
    assert record.status == "failed"
    assert "lacks" in (record.error or ""), record.error
    assert load_workflow(harness.client, KEYS, bystander).status == "finished"


def test_replay_starts_items_as_the_window_the_workers_recorded_did(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    windowed = Limits(window=3)
    worker = LifecycleWorker(KEYS, pool=redis_client.connection_pool, limits=windowed)
    worker.onStart()  # records the limits it runs with, as at every start
    worker.onStop()
    recorded = replay_limits(argparse.Namespace(), redis_client, KEYS)
    assert recorded.window == 3
    harness = Harness(redis_client, KEYS)
    harness.advancer = Advancer(redis_client, KEYS, limits=windowed)
    workflow_id = harness.submit(compile_text("A → * B → C"), list(range(20)), "windowed")
    for _ in range(3):  # A, then two rounds of items: 3 run at a time
        harness.advance()
        harness.work(echo)
    Client(redis_client, KEYS).terminate(workflow_id)
    harness.pump(echo)
    archive = tmp_path / "archive"
    archive_all(redis_client, archive)
    report = audit_archive(archive, KEYS, client=redis_client, limits=recorded)
    assert report.ok, report.first_problem
    # Replayed with another window, it starts items the live run never started.
    assert not audit_archive(archive, KEYS, client=redis_client).ok


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("f:2", b'"x"'),
        ("f:2", b"[-5,300]"),
        ("f:2", b"[1,100000000]"),  # more items than any iteration may have
        ("f:2", b"null"),
        ("r:2.5", b"0"),
        ("q:2/0", b'{"a":1}'),
    ],
)
def test_garbage_in_an_entry_fails_its_workflow_alone_naming_the_field(
    harness: Harness, field: str, value: bytes
) -> None:
    graph = compile_text("A → * B → C")
    harness.advancer = Advancer(harness.client, KEYS, limits=Limits(window=100))
    victim = harness.submit(graph, list(range(300)), "victim")
    harness.advance()
    harness.work(echo)
    harness.advance()  # 100 of 300 items start, the rest are queued
    bystander = harness.submit(graph, list(range(300)), "bystander")
    harness.client.hset(KEYS.workflow(victim), field, value)
    harness.pump(echo)
    record = load_workflow(harness.client, KEYS, victim)
    assert record.status == "failed"
    assert f"its stored record is corrupt: field {field}: " in (record.error or ""), record.error
    assert load_workflow(harness.client, KEYS, bystander).status == "finished"
