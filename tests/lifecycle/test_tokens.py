"""Who may answer a task: only an end-task carrying its attempt's token advances a workflow.

A forged, stale or second answer changes nothing and is refused with the reason
(the lifecycle worker dead-letters it); a genuine late answer for a workflow that
has ended is acknowledged quietly.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import redis

from flowlang.compiler import compile_text
from lifecycle import events as ev
from lifecycle.engine.advance import Advancer
from lifecycle.engine.store import load_workflow
from lifecycle.keys import Keys
from lifecycle.submit import start_workflow, terminate_workflow
from lifecycle.worker import LifecycleWorker
from rqse.keys import dead_letter_key
from tests.lifecycle.harness import Harness, decode

KEYS = Keys()
FLOW = compile_text("A → B")


def _first_start(client: redis.Redis) -> dict[str, Any]:
    return decode(client.xrange(KEYS.tasks("default"))[0][1])


def _answer(client: redis.Redis, event: dict[str, Any]) -> str:
    return client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in event.items()}).decode()


def _apply(client: redis.Redis, **options: Any) -> Any:
    reply = client.xreadgroup(KEYS.lifecycle_group, "t", {KEYS.lifecycle: ">"}, count=100)
    entries = [(i.decode(), decode(f)) for _, items in reply or [] for i, f in items]
    return Advancer(client, KEYS, **options).apply(entries)


def _started_names(client: redis.Redis) -> list[str]:
    return [decode(f)["name"] for _, f in client.xrange(KEYS.tasks("default"))]


def test_every_start_task_carries_a_token_that_differs_per_workflow_and_attempt(
    harness: Harness, redis_client: redis.Redis
) -> None:
    harness.submit(FLOW, {}, "one")
    harness.submit(FLOW, {}, "two")
    harness.advance()
    tokens = [decode(f)["token"] for _, f in redis_client.xrange(KEYS.tasks("default"))]
    assert len(tokens) == 2 and len(set(tokens)) == 2 and all(len(t) == 16 for t in tokens)


def test_an_end_task_with_a_forged_token_is_refused_and_changes_nothing(
    harness: Harness, redis_client: redis.Redis
) -> None:
    workflow = harness.submit(FLOW, {}, "forged")
    harness.advance()
    forged = {**ev.end_task(_first_start(redis_client), {"evil": 1}), "token": "0" * 16}
    forged_id = _answer(redis_client, forged)
    result = _apply(redis_client)
    assert [event_id for event_id, _ in result.rejected] == [forged_id]
    assert "wrong token" in result.rejected[0][1]
    record = load_workflow(redis_client, KEYS, workflow)
    assert record.status == "running" and record.ends == {}
    assert _started_names(redis_client) == ["A"]


def test_an_end_task_without_a_token_is_refused_unless_the_worker_takes_untokened_answers(
    harness: Harness, redis_client: redis.Redis
) -> None:
    workflow = harness.submit(FLOW, {}, "seed-style")
    harness.advance()
    bare = {k: v for k, v in ev.end_task(_first_start(redis_client), {}).items() if k != "token"}
    _answer(redis_client, bare)
    result = _apply(redis_client)
    assert "carries no token" in result.rejected[0][1]
    assert load_workflow(redis_client, KEYS, workflow).ends == {}
    _answer(redis_client, bare)
    result = _apply(redis_client, untokened_answers=True)
    assert result.rejected == [] and result.committed == 1
    assert _started_names(redis_client) == ["A", "B"]


def test_a_second_answer_to_one_attempt_is_refused_and_starts_nothing_twice(
    harness: Harness, redis_client: redis.Redis
) -> None:
    workflow = harness.submit(FLOW, {}, "twice")
    harness.advance()
    start = _first_start(redis_client)
    _answer(redis_client, ev.end_task(start, {"first": 1}))
    second = _answer(redis_client, ev.end_task(start, {"second": 2}))
    result = _apply(redis_client)
    assert [event_id for event_id, _ in result.rejected] == [second]
    assert "not running" in result.rejected[0][1]
    assert _started_names(redis_client) == ["A", "B"]
    assert load_workflow(redis_client, KEYS, workflow).ends["1"][2] == {"first": 1}


def test_a_stale_answer_from_an_earlier_attempt_is_refused(
    harness: Harness, redis_client: redis.Redis
) -> None:
    workflow = harness.submit(compile_text("A (- $retries: 1 -) → B"), {}, "stale")
    harness.advance()
    first = _first_start(redis_client)
    _answer(redis_client, ev.end_task(first, error="boom"))
    _apply(redis_client)  # attempt 2 starts
    late = _answer(redis_client, ev.end_task(first, {"late": True}))
    result = _apply(redis_client)
    assert [event_id for event_id, _ in result.rejected] == [late]
    assert "attempt 2 runs now" in result.rejected[0][1]
    assert load_workflow(redis_client, KEYS, workflow).state.running == {"1": 2}


def test_a_genuine_answer_after_the_workflow_was_terminated_is_acknowledged_quietly(
    harness: Harness, redis_client: redis.Redis
) -> None:
    workflow = harness.submit(FLOW, {}, "ended")
    harness.advance()
    start = _first_start(redis_client)
    terminate_workflow(redis_client, workflow, "stop")
    _apply(redis_client)
    answer = _answer(redis_client, ev.end_task(start, {}))
    result = _apply(redis_client)
    assert result.rejected == [] and answer in result.duplicates
    assert load_workflow(redis_client, KEYS, workflow).status == "terminated"


def test_the_lifecycle_worker_dead_letters_a_forged_answer_with_the_reason(
    redis_client: redis.Redis, redis_url: str
) -> None:
    import threading

    pool = redis.ConnectionPool.from_url(redis_url)
    worker = LifecycleWorker(pool=pool, handle_signals=False, block_ms=50)
    thread = threading.Thread(target=worker.listen, daemon=True)
    thread.start()
    try:
        workflow = start_workflow(redis_client, FLOW, {}, "dead-lettered")
        deadline = time.monotonic() + 10
        while not redis_client.exists(KEYS.tasks("default")):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        forged = {**ev.end_task(_first_start(redis_client), {}), "token": "f" * 16}
        forged_id = _answer(redis_client, forged)
        dead = dead_letter_key(KEYS.lifecycle)
        while not redis_client.xlen(dead):
            assert time.monotonic() < deadline, "the forged answer was never dead-lettered"
            time.sleep(0.02)
        entry = redis_client.xrange(dead)[0][1]
        assert forged_id.encode() in b"".join(entry.values())
        assert b"wrong token" in b"".join(entry.values())
        assert load_workflow(redis_client, KEYS, workflow).status == "running"
    finally:
        worker.stop()
        thread.join(10)
        pool.disconnect()


def test_a_run_started_before_tokens_existed_still_takes_its_answers(
    harness: Harness, redis_client: redis.Redis
) -> None:
    workflow = harness.submit(FLOW, {}, "old-run")
    harness.advance()
    redis_client.hdel(KEYS.workflow(workflow), "t")  # as stored by an engine without tokens
    bare = {k: v for k, v in ev.end_task(_first_start(redis_client), {}).items() if k != "token"}
    _answer(redis_client, bare)
    result = _apply(redis_client)
    assert result.rejected == [] and result.committed == 1
    assert _started_names(redis_client) == ["A", "B"]
