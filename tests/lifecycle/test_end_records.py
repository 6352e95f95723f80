"""A chain step keeps its output once: the end record names the successor it started.

The successor's start record holds that very output as its input, and a plain successor
(one predecessor, on no cycle and after none) starts once a run, its retries and
restarts keeping its input: readers take the output from there. Anything else keeps
the output in its own end record.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall
from lifecycle import records as rec
from lifecycle.client import Client
from lifecycle.engine.store import load_workflow
from lifecycle.events import end_task
from lifecycle.inspect import describe_workflow, read_workflow
from lifecycle.keys import TASK_GROUP, Keys

from .harness import Harness, decode

KEYS = Keys()


def _named(call: TaskCall) -> Any:
    return {"by": call.name, "saw": call.input}


def _stored(harness: Harness, workflow_id: str, field: str) -> Any:
    raw = harness.client.hget(KEYS.workflow(workflow_id), field)
    return None if raw is None else orjson.loads(raw)


def test_a_chain_step_keeps_its_output_in_the_successors_start_record_only(
    harness: Harness,
) -> None:
    workflow_id = harness.submit(compile_text("A → B → C"), {"n": 1}, "wf-chain")
    harness.pump(_named)
    a_output = {"by": "A", "saw": {"n": 1}}
    ended, worker, successor = _stored(harness, workflow_id, "o:1")
    assert (worker, successor) == ("harness", "2")
    assert _stored(harness, workflow_id, "n:2")[2] == a_output
    # The last task has no successor: its output stays in its own record.
    assert _stored(harness, workflow_id, "o:3")[1:4] == [True, _named_output("C"), None]
    loaded = load_workflow(harness.client, KEYS, workflow_id)
    assert loaded.status == rec.FINISHED
    assert loaded.ends["1"] == [loaded.created + ended, True, a_output, None, "harness"]
    assert loaded.ends["2"][1:] == [True, _named_output("B"), None, "harness"]
    shown = {t["key"]: t for t in describe_workflow(harness.client, KEYS, workflow_id)["tasks"]}
    assert shown["1"]["output"] == a_output and shown["1"]["state"] == "ended"
    assert shown["2"]["input"] == a_output


def _named_output(name: str) -> Any:
    saw: Any = {"n": 1}
    for step in "ABC":
        saw = {"by": step, "saw": saw}
        if step == name:
            return saw
    raise AssertionError(name)


def test_the_output_reads_the_same_after_its_successor_failed_and_was_restarted(
    harness: Harness,
) -> None:
    workflow_id = harness.submit(compile_text("A → B"), {"n": 1}, "wf-restarted")
    fail = {"B": True}

    def task(call: TaskCall) -> Any:
        if fail.get(call.name):
            raise RuntimeError("B broke")
        return _named(call)

    harness.pump(task)
    assert load_workflow(harness.client, KEYS, workflow_id).status == rec.FAILED
    fail.clear()
    Client(harness.client, KEYS).restart(workflow_id)
    harness.pump(task)
    loaded = load_workflow(harness.client, KEYS, workflow_id)
    assert loaded.status == rec.FINISHED
    assert loaded.starts["2"][0] == 2  # B's second attempt, with A's output as before
    assert len(_stored(harness, workflow_id, "o:1")) == 3
    assert loaded.ends["1"][2] == {"by": "A", "saw": {"n": 1}} == loaded.starts["2"][2]


def test_a_paused_chain_names_the_held_successors_record_and_reads_after_resume(
    harness: Harness,
) -> None:
    workflow_id = harness.submit(compile_text("A → B"), {"n": 1}, "wf-paused")
    harness.advance()  # A started
    client = Client(harness.client, KEYS)
    client.pause(workflow_id)
    harness.pump(_named)  # A ends while paused: B's start is held, its record written
    assert _stored(harness, workflow_id, "o:1")[2] == "2"
    held = load_workflow(harness.client, KEYS, workflow_id)
    assert held.ends["1"][2] == {"by": "A", "saw": {"n": 1}}
    client.resume(workflow_id)
    harness.pump(_named)
    loaded = load_workflow(harness.client, KEYS, workflow_id)
    assert loaded.status == rec.FINISHED
    assert loaded.ends["1"][2] == {"by": "A", "saw": {"n": 1}}


def _laps(call: TaskCall) -> Any:
    """A cycle's tasks: A counts laps, B ends the workflow (failing) on the second."""
    lap = call.input["lap"]
    if call.name == "A":
        return {"lap": lap + 1}
    if lap == 2:
        raise RuntimeError("two laps")
    return call.input


@pytest.mark.parametrize(
    ("flow", "returned", "why"),
    [
        ("A|B → C", _named, "C waits for both: a join"),
        ("A → :m; B → :m; :m → C", _named, "C met by two"),
        ("A → B → :start", _laps, "a cycle"),
        ("A → * B", lambda call: [1, 2] if call.name == "A" else 0, "an iteration"),
    ],
)
def test_an_output_stays_in_its_own_record_where_no_successor_holds_it_as_is(
    harness: Harness, flow: str, returned: Any, why: str
) -> None:
    workflow_id = harness.submit(compile_text(flow), {"lap": 0}, "wf-whole")
    harness.pump(returned)
    loaded = load_workflow(harness.client, KEYS, workflow_id)
    assert loaded.status == (rec.FAILED if why == "a cycle" else rec.FINISHED), why
    assert loaded.ends
    for key in loaded.ends:
        stored = _stored(harness, workflow_id, rec.end_field(key))
        assert len(stored) == 5, (why, key, stored)


def test_an_answer_without_output_keeps_its_none_in_its_own_record(harness: Harness) -> None:
    workflow_id = harness.submit(compile_text("A → B"), {"n": 1}, "wf-none")
    harness.advance()
    [(stream, [(entry_id, fields)])] = harness.client.xreadgroup(
        TASK_GROUP, "t", {KEYS.tasks("default"): ">"}
    )
    answer = end_task(decode(fields), {})
    answer["output"] = None  # as a task worker may send it: B then starts with {}
    harness.client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in answer.items()})
    harness.client.xack(stream, TASK_GROUP, entry_id)
    harness.pump(_named)
    loaded = load_workflow(harness.client, KEYS, workflow_id)
    assert _stored(harness, workflow_id, "o:1")[1:4] == [True, None, None]
    assert loaded.ends["1"][2] is None and loaded.starts["2"][2] == {}
    assert loaded.status == rec.FINISHED


def test_inspect_shows_an_output_whose_successors_record_is_gone_as_unknown_and_says_why(
    harness: Harness,
) -> None:
    workflow_id = harness.submit(compile_text("A → B → C"), {"n": 1}, "wf-damaged-ref")
    harness.pump(_named)
    key = KEYS.workflow(workflow_id)
    harness.client.hdel(key, "n:2")
    harness.client.hset(key, "o:2", orjson.dumps([5, "w", 3]))  # not a key: damaged
    record = read_workflow(harness.client, KEYS, workflow_id)
    assert record.ends["1"][1:] == [True, None, None, "harness"]
    problems = {p.field: p.message for p in record.problems}
    assert set(problems) == {"o:1", "o:2"}
    assert "the input of task 2, whose start record is missing" in problems["o:1"]
    assert "successor key" in problems["o:2"]
    shown = {t["key"]: t for t in describe_workflow(harness.client, KEYS, workflow_id)["tasks"]}
    assert shown["1"]["state"] == "ended" and shown["1"]["output"] is None
    assert load_workflow(harness.client, KEYS, workflow_id).ends["1"][2] is None
