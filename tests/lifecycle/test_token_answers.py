"""An end-task is taken only with its start-task's token: a forged one is refused and
the genuine answer still counts; a deleted workflow's answers do not answer a namesake.

Each test drives one :class:`Advancer` (the harness's) from the start-task to its
answer.
"""

from __future__ import annotations

from typing import Any

import orjson
import redis

from flowlang.compiler import compile_text
from lifecycle import events as ev
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
    # the forged answer changed nothing: the genuine one is still taken
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
