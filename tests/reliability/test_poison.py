"""Scenario 6: poison and forged events injected while a load runs.

Garbage entries on the lifecycle stream and on a task stream, forged end-tasks
(a wrong token), a start-workflow whose input nests 300 deep and one whose
input is all sent by raw XADD: each is dead-lettered with its reason (the deep one also
fails its workflow), and the bystanders all finish exactly once. An input
integer past 64 bits is its own test.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson

from flowlang.compiler import compile_text
from lifecycle.events import end_task
from lifecycle.submit import start_workflow
from tests.reliability.helpers import (
    KEYS,
    Engine,
    check_exactly_once,
    dead_letters,
    decoded,
    record,
    size,
    states,
    submit,
    wait_all_ended,
)

WORKFLOWS = size(1000, 10_000)


def raw(fields: dict[str, object]) -> dict[str, bytes]:
    return {k: v if isinstance(v, bytes) else orjson.dumps(v) for k, v in fields.items()}


def wait_for(condition: Callable[[], object], what: str, timeout: float = 20) -> object:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def test_poison_and_forged_events_are_dead_lettered_and_bystanders_finish_once(
    engine_factory: Callable[..., Engine],
) -> None:
    engine = engine_factory()
    client = engine.client
    ids, expected = submit(client, WORKFLOWS)
    running = [engine.lifecycle("lifecycle-0"), engine.noop("noop-0"), engine.noop("noop-1")]
    # A workflow whose first task nobody serves (kind `held`): its start-task waits for
    # the forgeries, then for the genuine answer.
    held = start_workflow(client, compile_text("held:X → Y"), {"n": 1}, "held")
    graph = compile_text(FLOW_FOR_RAW)
    start_workflow(client, graph, [0], "raw-graph-stored")  # stores the graph for raw XADDs
    digest = graph.content_hash()
    deep = b"[" * 300 + b"0" + b"]" * 300  # orjson writes at most 255 levels
    lifecycle, tasks = KEYS.lifecycle, KEYS.tasks("default")
    injected = {
        "lifecycle: not JSON": (lifecycle, {b"kind": b"\xff\xfe{"}),
        "lifecycle: no kind": (lifecycle, {b"workflow": b'"w1"'}),
        "lifecycle: end-task of the wrong types": (
            lifecycle, raw({"kind": "end-task", "workflow": 42, "key": [], "attempt": "x"}),
        ),
        "task stream: not JSON": (tasks, {b"kind": b"start-task"}),
        "task stream: start-task without fields": (tasks, raw({"kind": "start-task"})),
        "start-workflow 300 deep": (
            lifecycle,
            {**raw({"kind": "start-workflow", "workflow": "deep", "graph": digest, "salt": "s"}),
             b"input": deep},
        ),
    }  # fmt: skip
    entry_ids = {  # (stream, id): ids repeat across streams
        name: (stream, client.xadd(stream, fields).decode())
        for name, (stream, fields) in injected.items()
    }
    (start,) = wait_for(lambda: decoded(client, KEYS.tasks("held")), "held's start-task")
    forged = {
        "end-task with a wrong token": {**end_task(start, {"x": 1}), "token": "forged"},
        "end-task with another attempt's token": {
            **end_task(start, {"x": 1}),
            "token": start["token"][::-1],
        },
    }
    for name, event in forged.items():
        entry_ids[name] = (lifecycle, client.xadd(lifecycle, raw(event)).decode())
    found = wait_all_ended(client, ids, timeout=size(60, 600))
    counts = check_exactly_once(client, found, expected)

    letters = {
        (letter["stream"], letter["id"]): letter
        for stream in (lifecycle, tasks)
        for letter in dead_letters(client, stream)
    }
    missing = [name for name, entry in entry_ids.items() if entry not in letters]
    assert not missing, f"not dead-lettered: {missing}"
    reasons = {
        name: f"{letters[e]['reason']}: {letters[e]['error']}" for name, e in entry_ids.items()
    }
    assert all(len(why) > len("rejected: ") for why in reasons.values()), reasons
    assert "wrong token" in reasons["end-task with a wrong token"]
    assert "wrong token" in reasons["end-task with another attempt's token"]
    deep_state = states(client, ["deep"])["deep"]
    assert deep_state.get("status") in (None, "failed"), deep_state

    client.xadd(lifecycle, raw(end_task(start, {"x": 1}, worker="genuine")))
    held_state = wait_all_ended(client, [held], timeout=20)[held]
    assert held_state["status"] == "finished"
    assert all(proc.poll() is None for proc in running), "a worker exited"
    record(
        "poison",
        injected=len(entry_ids),
        dead_lettered=len(entry_ids) - len(missing),
        deep_workflow=deep_state.get("status", "not started"),
        **counts,
    )
    for name, why in reasons.items():
        print(f"  {name}: {why[:160]}")


FLOW_FOR_RAW = "R"


def test_a_start_workflow_with_an_integer_past_64_bits_is_dead_lettered_not_rounded(
    engine_factory: Callable[..., Engine],
) -> None:
    engine = engine_factory()
    client = engine.client
    engine.lifecycle("lifecycle-0")
    engine.noop("noop-0")
    graph = compile_text(FLOW_FOR_RAW)
    start_workflow(client, graph, [0], "raw-graph-stored")
    huge = {
        **raw({"kind": "start-workflow", "workflow": "huge", "graph": graph.content_hash()}),
        b"salt": b'"s"',
        b"input": b"1" + b"0" * 40,
    }
    entry = client.xadd(KEYS.lifecycle, huge).decode()
    wait_all_ended(client, ["raw-graph-stored"], timeout=20)
    deadline = time.monotonic() + 10
    while not (letters := [x for x in dead_letters(client, KEYS.lifecycle) if x["id"] == entry]):
        state = states(client, ["huge"])["huge"]
        assert state.get("status") != "finished", f"ran on {state.get('output')!r}"
        assert time.monotonic() < deadline, "neither dead-lettered nor finished"
        time.sleep(0.1)
    assert "64" in str(letters[0]["error"]) or "integer" in str(letters[0]["error"])
