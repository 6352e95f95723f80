"""Regressions found in review of the built-ins and the task contract."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import redis

from lifecycle.keys import Keys
from rqse import message
from rqse.events import encode_event
from workers import HandBack, Task, TaskListener
from workers.errors import WaitParameterError
from workers.wait import WaitTaskListener
from workers.wait_events import EventWatcher, counts_for, json_equal, matches
from workers.waitspec import parse_duration

KEYS = Keys()


def start_task(workflow: str, name: str, parameters: dict[str, Any], input: Any = None) -> dict:
    event = {
        "workflow": workflow,
        "name": name,
        "index": 1,
        "key": "1",
        "attempt": 1,
        "id": f"{workflow}/1/1",
        "input": input or {},
        "parameters": parameters,
    }
    return encode_event(message(event, kind="start-task"))


def end_tasks(client: redis.Redis) -> list[dict[str, Any]]:
    return [
        {k.decode(): orjson.loads(v) for k, v in fields.items()}
        for _, fields in client.xrange(KEYS.lifecycle)
        if fields.get(b"kind") == b'"end-task"'
    ]


def test_an_event_the_watcher_read_before_the_wait_was_registered_still_ends_it(
    redis_url: str, redis_client: redis.Redis
) -> None:
    watcher = EventWatcher(KEYS, url=redis_url, handle_signals=False, block_ms=50)
    tasks = WaitTaskListener(KEYS, url=redis_url, handle_signals=False, block_ms=50)
    watcher.listen(idle_timeout=0.2)
    tasks.listen(idle_timeout=0.2)
    redis_client.xadd(
        KEYS.tasks("wait"),
        start_task("wf1", "wait:event", {"event": "approved", "match": "input"}, {"order": 7}),
    )
    redis_client.xadd(
        KEYS.lifecycle, encode_event({"kind": "approved", "workflow": "wf1", "order": 7})
    )
    watcher.listen(idle_timeout=0.3)  # reads the event: no wait registered yet
    tasks.listen(idle_timeout=0.3)  # registers, then looks back
    (end,) = end_tasks(redis_client)
    assert (end["workflow"], end["status"]) == ("wf1", "SUCCESS")
    assert redis_client.hgetall(KEYS.wait_events("approved")) == {}


def test_an_event_in_the_start_tasks_millisecond_counts_whatever_its_sequence() -> None:
    assert counts_for("1700000000000-0", {"since": "1700000000000-5"})
    assert not counts_for("1699999999999-9", {"since": "1700000000000-0"})


def test_match_keeps_json_types() -> None:
    assert not json_equal(True, 1) and not json_equal(0, False)
    assert json_equal(1, 1.0) and json_equal({"a": [1, True]}, {"a": [1.0, True]})
    assert not matches({"approved": 1}, {"approved": True})
    assert matches({"approved": True, "n": 2}, {"approved": True, "n": 2.0, "x": 0})


@pytest.mark.parametrize("duration", [1e306, 10**400, "1e306", "100000000d"])
def test_an_absurd_duration_is_a_parameter_error(duration: Any) -> None:
    with pytest.raises(WaitParameterError):
        parse_duration(duration)


def test_an_output_that_is_not_json_fails_the_task_instead_of_looping(
    redis_url: str, redis_client: redis.Redis
) -> None:
    runs: list[str] = []

    class Bad(TaskListener):
        kind = "calc"

        def run(self, task: Task) -> Any:
            runs.append(task.id)
            return {"tags": {1, 2}}

    redis_client.xadd(KEYS.tasks("calc"), start_task("w-set", "calc:x", {}))
    Bad(url=redis_url, handle_signals=False, block_ms=50, claim_idle=0.2).listen(idle_timeout=1)
    (end,) = end_tasks(redis_client)
    assert end["status"] == "FAILURE" and "output is not JSON" in end["error"]
    assert runs == ["w-set/1/1"]


def test_a_task_handed_back_at_every_shutdown_is_never_dead_lettered(
    redis_url: str, redis_client: redis.Redis
) -> None:
    class Polite(TaskListener):
        kind = "job"

        def run(self, task: Task) -> Any:
            self.stop()  # a shutdown arrives while the task runs
            raise HandBack()

    redis_client.xadd(KEYS.tasks("job"), start_task("w", "job:x", {}))
    for _ in range(7):  # more shutdowns than max_deliveries
        worker = Polite(url=redis_url, handle_signals=False, block_ms=50, consumer="job-0")
        worker.listen(idle_timeout=0.3)
    assert redis_client.xlen(KEYS.tasks("job") + ":dead") == 0
    assert redis_client.xpending(KEYS.tasks("job"), "workers")["pending"] == 0
    entries = redis_client.xrange(KEYS.tasks("job"))
    assert len(entries) == 8  # the original and seven hand-backs
    # Each hand-back is the same start-task sent again, marked so for replay.
    assert [b"recovered" in fields for _, fields in entries] == [False] + [True] * 7
    assert len({fields[b"id"] for _, fields in entries}) == 1
