"""The lifecycle keeps the token of each start-task it sends and checks the end-task
against it: the same answers are taken and refused as when every check derives it.

Each test drives one :class:`Advancer` (the harness's) from the start-task to its
answer, so the check meets the token kept when the start-task was sent.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle import events as ev
from lifecycle.engine import transition
from lifecycle.engine.store import load_workflow
from lifecycle.keys import Keys
from tests.lifecycle.harness import Harness, decode

KEYS = Keys()
FLOW = compile_text("A → B")


def _starts(client: redis.Redis) -> list[dict[str, Any]]:
    return [decode(f) for _, f in client.xrange(KEYS.tasks("default"))]


def _answer(client: redis.Redis, event: dict[str, Any]) -> None:
    client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in event.items()})


def test_a_forged_token_is_refused_by_the_worker_that_sent_the_start_task(
    harness: Harness, redis_client: redis.Redis
) -> None:
    workflow = harness.submit(FLOW, {}, "kept")
    harness.advance()
    start = _starts(redis_client)[0]
    _answer(redis_client, {**ev.end_task(start, {"evil": 1}), "token": "0" * 16})
    harness.advance()
    assert load_workflow(redis_client, KEYS, workflow).ends == {}
    # the forged answer used up the kept token: the genuine one is checked by deriving it
    _answer(redis_client, ev.end_task(start, {"fine": 1}))
    harness.advance()
    assert [s["name"] for s in _starts(redis_client)] == ["A", "B"]


def test_an_answer_to_a_deleted_workflow_does_not_answer_its_namesake(
    harness: Harness, redis_client: redis.Redis
) -> None:
    workflow = harness.submit(FLOW, {}, "again")
    harness.advance()
    old = _starts(redis_client)[0]
    redis_client.delete(KEYS.workflow(workflow))
    harness.submit(FLOW, {}, workflow)  # a new salt, the same id, key and attempt
    harness.advance()
    new = _starts(redis_client)[1]
    assert (old["key"], old["attempt"]) == (new["key"], new["attempt"])
    assert old["token"] != new["token"]
    _answer(redis_client, ev.end_task(old, {"stale": 1}))
    harness.advance()
    assert load_workflow(redis_client, KEYS, workflow).ends == {}
    _answer(redis_client, ev.end_task(new, {"fresh": 1}))
    harness.advance()
    assert load_workflow(redis_client, KEYS, workflow).ends[new["key"]][2] == {"fresh": 1}


def test_answers_to_more_start_tasks_than_are_kept_are_still_checked(
    harness: Harness, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transition, "_TOKENS_KEPT", 2)  # 7 starts: three generations
    workflows = [harness.submit(FLOW, {}, f"many{n}") for n in range(7)]
    harness.advance()
    starts = _starts(redis_client)
    _answer(redis_client, {**ev.end_task(starts[0], {"evil": 1}), "token": "f" * 16})
    _answer(redis_client, {**ev.end_task(starts[6], {"evil": 1}), "token": "f" * 16})
    harness.advance()
    assert all(load_workflow(redis_client, KEYS, w).ends == {} for w in workflows)
    for start in starts:
        _answer(redis_client, ev.end_task(start, {"n": start["workflow"]}))
    harness.advance()
    for start in starts:
        ends = load_workflow(redis_client, KEYS, start["workflow"]).ends
        assert ends[start["key"]][2] == {"n": start["workflow"]}
