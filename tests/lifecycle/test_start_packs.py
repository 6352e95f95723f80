"""A lifecycle worker told to pack start-tasks writes a transaction's start-tasks to a
stream as ``start-tasks`` entries: the kinds it is told to, never ``wait``, at most
PACK_TASKS per entry, each task the start-task it stands for."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle import events as ev
from lifecycle.cli.support import CliError
from lifecycle.cli.worker import pack_starts_from
from lifecycle.client import Client
from lifecycle.engine.advance import Advancer, pack_kinds
from lifecycle.engine.commit import PACK_BYTES, PACK_TASKS
from lifecycle.engine.store import load_workflow
from lifecycle.keys import Keys
from tests.lifecycle.harness import Harness, decode

KEYS = Keys()


def _entries(client: redis.Redis, kind: str = "default") -> list[dict[str, Any]]:
    return [decode(fields) for _, fields in client.xrange(KEYS.tasks(kind))]


def _starts(client: redis.Redis, kind: str = "default") -> list[dict[str, Any]]:
    """Every start-task on the kind's stream, packs unpacked."""
    found = []
    for entry_id, fields in client.xrange(KEYS.tasks(kind)):
        event = decode(fields)
        if event["kind"] == ev.START_TASKS:
            found += ev.unpacked_starts(entry_id.decode(), event)
        else:
            found.append(event)
    return found


def _without_token(start: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in start.items() if name != "token"}


def test_a_batch_of_start_tasks_is_one_entry_holding_the_start_tasks_it_stands_for(
    redis_client: redis.Redis,
) -> None:
    flow = compile_text('A (- {"p": "50%"} -)')
    harness = Harness(redis_client, pack_starts=True)
    for n in range(5):
        harness.submit(flow, {"n": n}, f"wf{n}")
    harness.advance()
    packed = _entries(redis_client)
    assert [e["kind"] for e in packed] == [ev.START_TASKS]
    redis_client.flushdb()
    plain = Harness(redis_client)
    for n in range(5):
        plain.submit(flow, {"n": n}, f"wf{n}")
    plain.advance()
    singles = _entries(redis_client)
    assert [e["kind"] for e in singles] == [ev.START_TASK] * 5
    # The same fields and values but the token (each workflow's salt is its own).
    assert sorted(map(_without_token, ev.unpacked_starts("1-0", packed[0])), key=str) == sorted(
        map(_without_token, singles), key=str
    )
    assert all(type(start["token"]) is str for start in ev.unpacked_starts("1-0", packed[0]))


def test_a_pack_holds_at_most_pack_tasks_start_tasks(redis_client: redis.Redis) -> None:
    harness = Harness(redis_client, pack_starts=True)
    flow = compile_text("A")
    for n in range(PACK_TASKS + 50):
        harness.submit(flow, {"n": n}, f"wf{n}")
    while harness.advance():
        pass
    sizes = [len(e["tasks"]) for e in _entries(redis_client)]
    assert sum(sizes) == PACK_TASKS + 50
    assert max(sizes) == PACK_TASKS and len(sizes) >= 2


def test_only_the_kinds_named_are_packed_and_by_default_no_built_in_kind(
    redis_client: redis.Redis,
) -> None:
    harness = Harness(redis_client, pack_starts={"a"})
    for n in range(3):
        harness.submit(compile_text("a:X|b:Y"), {"n": n}, f"wf{n}")
    harness.advance()
    assert [e["kind"] for e in _entries(redis_client, "a")] == [ev.START_TASKS]
    assert [e["kind"] for e in _entries(redis_client, "b")] == [ev.START_TASK] * 3
    redis_client.flushdb()
    every = Harness(redis_client, pack_starts=True)
    for n in range(3):
        flow = compile_text("<http://example.com/x> → C; wait:delay (- {seconds: 60} -) | b:Y;")
        every.submit(flow, None, f"w{n}")
    every.advance()
    assert [e["kind"] for e in _entries(redis_client, "wait")] == [ev.START_TASK] * 3
    assert [e["kind"] for e in _entries(redis_client, "resource")] == [ev.START_TASK] * 3
    assert [e["kind"] for e in _entries(redis_client, "b")] == [ev.START_TASKS]


def test_the_wait_kind_cannot_be_named_for_packing(redis_client: redis.Redis) -> None:
    with pytest.raises(ValueError, match="'wait' kind"):
        Advancer(redis_client, KEYS, pack_starts={"wait", "a"})
    assert pack_kinds(True) is None and pack_kinds(False) == frozenset()
    with pytest.raises(CliError, match="--pack-starts: the built-in 'wait'"):
        pack_starts_from("a,wait")
    with pytest.raises(CliError, match="--pack-starts: name at least one kind"):
        pack_starts_from(" , ")
    assert pack_starts_from(None) is False and pack_starts_from("*") is True
    assert pack_starts_from("a, b") == frozenset({"a", "b"})


def test_a_refused_pack_fails_each_workflow_with_a_task_in_it_and_no_other(
    redis_client: redis.Redis,
) -> None:
    harness = Harness(redis_client, pack_starts=True)
    bad = [harness.submit(compile_text("bad:X"), {"n": n}, f"bad{n}") for n in range(3)]
    good = [harness.submit(compile_text("A"), {"n": n}, f"good{n}") for n in range(3)]
    redis_client.delete(KEYS.tasks("bad"))
    redis_client.set(KEYS.tasks("bad"), "not a stream")
    for _ in range(5):
        harness.advance()
    client = Client(redis_client, KEYS)
    assert [client.status(i).state for i in bad] == ["failed"] * 3
    assert [client.status(i).state for i in good] == ["running"] * 3
    assert len(_starts(redis_client)) == 3
    assert all("WRONGTYPE" in str(client.status(i).error) for i in bad)


def test_flows_finish_the_same_with_packed_start_tasks(redis_client: redis.Redis) -> None:
    def task(call: Any) -> Any:
        if call.name.startswith("L"):
            return [1, 2, 3]
        return {"name": call.name, "in": call.input}

    flows = [
        "A → B → C",
        "A → { B  C } → D",
        "L → * B → C",
        "A → L → * { B → C } → D",
    ]
    outcomes = []
    for pack_starts in (False, True):
        redis_client.flushdb()
        harness = Harness(redis_client, pack_starts=pack_starts)
        ids = [
            harness.submit(compile_text(text), {"n": 1}, f"f{n}") for n, text in enumerate(flows)
        ]
        harness.pump(task)
        records = [load_workflow(redis_client, KEYS, i) for i in ids]
        outcomes.append([(record.status, record.output) for record in records])
    assert outcomes[0] == outcomes[1]
    assert [state for state, _ in outcomes[1]] == ["finished"] * len(flows)


def test_a_task_with_a_deadline_goes_alone(redis_client: redis.Redis) -> None:
    harness = Harness(redis_client, pack_starts=True)
    for n in range(3):
        harness.submit(compile_text("A (- $timeout: 30 -) | B"), {"n": n}, f"wf{n}")
    harness.advance()
    starts = _entries(redis_client)
    singles = [e for e in starts if e["kind"] == ev.START_TASK]
    (pack,) = [e for e in starts if e["kind"] == ev.START_TASKS]
    assert sorted(e["name"] for e in singles) == ["A"] * 3
    assert [t["name"] for t in pack["tasks"]] == ["B"] * 3


def test_a_pack_never_grows_past_pack_bytes_and_a_larger_task_goes_alone(
    redis_client: redis.Redis,
) -> None:
    harness = Harness(redis_client, pack_starts=True)
    flow = compile_text("A")
    big = "x" * (PACK_BYTES // 3)
    for n in range(7):
        harness.submit(flow, {"n": n, "pad": big}, f"wf{n}")
    harness.submit(flow, {"pad": "y" * (PACK_BYTES + 10)}, "huge")
    harness.advance()
    packs = [(i, f) for i, f in redis_client.xrange(KEYS.tasks("default"))]
    kinds = [decode(f)["kind"] for _, f in packs]
    assert kinds.count(ev.START_TASK) == 1  # the one larger than a pack
    assert all(len(f[b"tasks"]) <= PACK_BYTES for _, f in packs if b"tasks" in f)
    assert sum(len(decode(f).get("tasks", [1])) for _, f in packs) == 8
    with pytest.raises(ValueError, match="collection of kinds"):
        pack_kinds("fast")
