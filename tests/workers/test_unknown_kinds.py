"""Only start-tasks (and rqse receipts) belong on a task stream: a task worker
dead-letters an entry of another kind (garbage, or a newer lifecycle's) with its
reason, where it used to acknowledge it unseen, so that nothing sent to it is lost
before it can read it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
import redis

from lifecycle.keys import TASK_GROUP, Keys
from rqse import EventListener, receipt_for
from rqse.events import encode_event
from rqse.keys import dead_letter_key
from workers import Task, TaskListener
from workers.noop import NoopWorker
from workers.wait import WaitTaskListener

KEYS = Keys()


class Job(TaskListener):
    kind = "job"

    def run(self, task: Task) -> Any:
        return {"ran": task.key}


def _options(client: redis.Redis) -> dict[str, Any]:
    return {"pool": client.connection_pool, "handle_signals": False, "block_ms": 50}


WORKERS: dict[str, tuple[str, Callable[[redis.Redis], EventListener]]] = {
    "noop": ("default", lambda c: NoopWorker(["default"], **_options(c))),
    "task listener": ("job", lambda c: Job(**_options(c))),
    "wait": ("wait", lambda c: WaitTaskListener(**_options(c))),
}


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_an_entry_of_another_kind_on_a_task_stream_is_dead_lettered_with_its_reason(
    redis_client: redis.Redis, name: str
) -> None:
    kind, make = WORKERS[name]
    stream = KEYS.tasks(kind)
    redis_client.xadd(stream, {"kind": b'"start-jobs"', "jobs": b"[]"})
    worker = make(redis_client)
    assert worker.listen(max_events=1, idle_timeout=2.0) == 1
    [(_, dead)] = redis_client.xrange(dead_letter_key(stream))
    assert orjson.loads(dead[b"reason"]) == "unselected"
    assert orjson.loads(dead[b"error"]).startswith(
        "kind 'start-jobs' is not one this consumer processes (start-task"
    )
    # Kept whole, for a requeue once a worker that reads it runs.
    assert orjson.loads(dead[b"fields"])["kind"] == '"start-jobs"'
    assert redis_client.xpending(stream, TASK_GROUP)["pending"] == 0
    assert worker.stats.ignored == 0


def test_the_start_task_after_an_entry_of_another_kind_is_still_answered(
    redis_client: redis.Redis,
) -> None:
    stream = KEYS.tasks("default")
    long_kind = "x" * 500
    redis_client.xadd(stream, {"kind": orjson.dumps(long_kind)})
    start = {
        "kind": "start-task",
        "workflow": "w1",
        "name": "A",
        "index": 1,
        "key": "1",
        "attempt": 1,
        "id": "w1/1/1",
        "input": {"n": 1},
        "parameters": {},
    }
    redis_client.xadd(stream, {k: orjson.dumps(v) for k, v in start.items()})
    worker = NoopWorker(["default"], **_options(redis_client))
    assert worker.listen(max_events=2, idle_timeout=2.0) == 2
    answers = [orjson.loads(f[b"workflow"]) for _, f in redis_client.xrange(KEYS.lifecycle)]
    assert answers == ["w1"]
    [(_, dead)] = redis_client.xrange(dead_letter_key(stream))
    error = orjson.loads(dead[b"error"])
    assert error.startswith("kind 'xxx") and len(error) < 200  # a long kind is cut


def test_a_receipt_a_seed_style_worker_wrote_to_its_task_stream_is_not_dead_lettered(
    redis_client: redis.Redis,
) -> None:
    stream = KEYS.tasks("default")
    redis_client.xadd(stream, encode_event(receipt_for("1-0")))  # as self.append() writes it
    worker = NoopWorker(None, **_options(redis_client))
    assert worker.listen(max_events=1, idle_timeout=2.0) == 1
    assert redis_client.exists(dead_letter_key(stream)) == 0
    assert worker.stats.ignored == 1
