"""Packed answers (an experiment): a no-op worker's batch answered by one end-tasks entry,
which the advancer expands into one end-task per answer."""

from __future__ import annotations

from typing import Any

import orjson
import redis

from flowlang.compiler import compile_text
from lifecycle import events as ev
from lifecycle.client import Client
from lifecycle.keys import Keys
from tests.lifecycle.harness import Harness, ScriptOnly, decode
from workers.noop import NoopWorker

KEYS = Keys()


def _worker(client: redis.Redis) -> NoopWorker:
    return NoopWorker(
        ["default"],
        pool=client.connection_pool,
        handle_signals=False,
        block_ms=20,
        pack_answers=True,
    )


def _drive(harness: Harness, worker: NoopWorker, rounds: int = 40) -> None:
    """Advance, then let the packing worker answer what was started, until both idle."""
    for _ in range(rounds):
        advanced = harness.advance()
        answered = worker.listen(idle_timeout=0.05)
        if not advanced and not answered:
            return
    raise AssertionError(f"still busy after {rounds} rounds")


def _states(client: redis.Redis, ids: list[str]) -> list[str]:
    return [Client(client, KEYS).status(i).state for i in ids]


def _pending(client: redis.Redis) -> int:
    return int(client.xpending(KEYS.lifecycle, KEYS.lifecycle_group)["pending"])


def test_a_batch_of_answers_is_one_end_tasks_entry(redis_client: redis.Redis) -> None:
    harness = Harness(redis_client)
    ids = [harness.submit(compile_text("A"), {"n": n}, f"wf{n}") for n in range(5)]
    harness.advance()
    assert _worker(redis_client).listen(idle_timeout=0.05) == 5
    ends = [decode(f) for _, f in redis_client.xrange(KEYS.lifecycle)][5:]  # after the starts
    assert [e["kind"] for e in ends] == [ev.END_TASKS]
    answers = ends[0]["answers"]
    assert sorted((a[0], a[4]) for a in answers) == [(i, {"n": n}) for n, i in enumerate(ids)]


def test_chains_and_fan_outs_finish_on_packed_answers_and_every_entry_is_acknowledged(
    redis_client: redis.Redis,
) -> None:
    harness = Harness(redis_client)
    worker = _worker(redis_client)
    # A fan-out's branches end in one batch: one pack holds several answers of a workflow.
    ids = [harness.submit(compile_text("A → B → C"), {"n": n}, f"c{n}") for n in range(10)]
    ids += [harness.submit(compile_text("A → B|C|D → E"), {"n": n}, f"f{n}") for n in range(5)]
    _drive(harness, worker)
    assert _states(redis_client, ids) == ["finished"] * len(ids)
    assert _pending(redis_client) == 0


def test_packed_answers_committed_by_the_script_finish_too(redis_client: redis.Redis) -> None:
    harness = Harness(redis_client)
    harness.advancer = ScriptOnly(redis_client, KEYS)  # every commit through advance.lua
    worker = _worker(redis_client)
    ids = [harness.submit(compile_text("A → B|C → D"), {"n": n}, f"s{n}") for n in range(6)]
    _drive(harness, worker)
    assert _states(redis_client, ids) == ["finished"] * len(ids)
    assert _pending(redis_client) == 0


def _first_answer(client: redis.Redis, harness: Harness, flow: str, workflow: str) -> list[Any]:
    """The right answer, output {"n": 1}, to the first task of a new workflow ``workflow``."""
    harness.submit(compile_text(flow), {"n": 1}, workflow)
    harness.advance()
    (start,) = [decode(f) for _, f in client.xrange(KEYS.tasks("default"))]
    return [start["workflow"], start["key"], start["attempt"], start["token"], {"n": 1}]


def _add_pack(client: redis.Redis, answers: list[Any]) -> Any:
    """An end-tasks entry of ``answers`` on the lifecycle stream: its id (bytes)."""
    fields = {"kind": ev.END_TASKS, "worker": "w", "answers": answers}
    return client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in fields.items()})


def test_a_malformed_answer_rejects_its_pack_and_the_others_still_apply(
    redis_client: redis.Redis,
) -> None:
    harness = Harness(redis_client)
    good = _first_answer(redis_client, harness, "A", "good")
    entry = _add_pack(redis_client, [good, ["bad", "1", "not an attempt", "t", None]])
    reply = redis_client.xreadgroup(KEYS.lifecycle_group, "t", {KEYS.lifecycle: ">"})
    entries = [(i.decode(), decode(f)) for _, items in reply for i, f in items]
    result = harness.advancer.apply(entries)
    assert [event_id for event_id, _ in result.rejected] == [entry.decode()]
    assert "answer 1 is" in result.rejected[0][1]
    assert _states(redis_client, ["good"]) == ["finished"]


def _pack_of_two(redis_client: redis.Redis, harness: Harness) -> str:
    """An end-tasks entry answering the first task of workflows x and y; its id."""
    for workflow in ("x", "y"):
        harness.submit(compile_text("A → B"), {"w": workflow}, workflow)
    harness.advance()
    starts = [decode(f) for _, f in redis_client.xrange(KEYS.tasks("default"))]
    answers = [[s["workflow"], s["key"], s["attempt"], s["token"], s["input"]] for s in starts]
    fields = {"kind": ev.END_TASKS, "worker": "w", "answers": answers}
    return redis_client.xadd(
        KEYS.lifecycle, {k: orjson.dumps(v) for k, v in fields.items()}
    ).decode()


def _apply_new(redis_client: redis.Redis, harness: Harness) -> object:
    reply = redis_client.xreadgroup(KEYS.lifecycle_group, "t", {KEYS.lifecycle: ">"})
    entries = [(i.decode(), decode(f)) for _, items in reply for i, f in items]
    return harness.advancer.apply(entries)


def test_a_pack_whose_workflows_all_commit_together_is_acknowledged_with_them(
    redis_client: redis.Redis,
) -> None:
    harness = Harness(redis_client)
    pack = _pack_of_two(redis_client, harness)
    result = _apply_new(redis_client, harness)
    assert pack in result.acknowledged and pack not in result.duplicates
    assert _pending(redis_client) == 0


def test_a_pack_committed_workflow_by_workflow_is_left_for_the_caller_to_acknowledge(
    redis_client: redis.Redis,
) -> None:
    harness = Harness(redis_client)
    harness.advancer = ScriptOnly(redis_client, KEYS)  # no workflow's script may ack it
    pack = _pack_of_two(redis_client, harness)
    result = _apply_new(redis_client, harness)
    assert result.committed == 2
    assert pack not in result.acknowledged and pack in result.duplicates
    pending = redis_client.xpending_range(KEYS.lifecycle, KEYS.lifecycle_group, "-", "+", 10)
    assert [p["message_id"].decode() for p in pending] == [pack]


def test_a_pack_delivered_again_after_its_answers_committed_changes_nothing(
    redis_client: redis.Redis,
) -> None:
    harness = Harness(redis_client)
    pack = _pack_of_two(redis_client, harness)
    reply = redis_client.xreadgroup(KEYS.lifecycle_group, "t", {KEYS.lifecycle: ">"})
    entries = [(i.decode(), decode(f)) for _, items in reply for i, f in items]
    assert harness.advancer.apply(entries).committed == 2
    started = redis_client.xlen(KEYS.tasks("default"))
    again = harness.advancer.apply(entries)  # as after a crash before its acknowledgement
    assert (again.committed, again.rejected) == (0, [])
    assert pack in again.duplicates
    assert redis_client.xlen(KEYS.tasks("default")) == started  # no B started twice


def test_a_second_answer_with_a_forged_token_inside_one_pack_is_refused(
    redis_client: redis.Redis,
) -> None:
    harness = Harness(redis_client)
    right = _first_answer(redis_client, harness, "A → B", "forged")
    entry = _add_pack(redis_client, [right, [*right[:3], "0" * 16, {"n": 2}]])
    result = _apply_new(redis_client, harness)
    assert result.committed == 1  # type: ignore[attr-defined]
    assert [event_id for event_id, _ in result.rejected] == [entry.decode()]  # type: ignore[attr-defined]


def test_a_lone_end_task_cannot_pass_itself_off_as_packed(redis_client: redis.Redis) -> None:
    harness = Harness(redis_client)
    harness.submit(compile_text("A → B"), {"n": 1}, "lone")
    harness.advance()
    (start,) = [decode(f) for _, f in redis_client.xrange(KEYS.tasks("default"))]
    answer = ev.end_task(start, {"n": 1}, worker="w")
    redis_client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in answer.items()})
    _apply_new(redis_client, harness)
    again = {**ev.end_task(start, error="late", worker="w"), "packed": True}
    entry = redis_client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in again.items()})
    result = _apply_new(redis_client, harness)
    assert [event_id for event_id, _ in result.rejected] == [entry.decode()]  # type: ignore[attr-defined]
