"""What a TaskListener answers when the task misbehaves: an output past the limits, an
exception (and how each is logged)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

from flowlang.limits import DEFAULT_LIMITS, Limits
from rqse.keys import dead_letter_key
from tests.conftest import wait_until
from tests.workers.helpers import KEYS, Threads, events, submit, wait_for_end
from workers import Task, TaskListener


class Maker(TaskListener):
    """Outputs what its input asks for: ``bytes`` characters of text, or ``depth`` nested
    arrays; raises for ``raise``."""

    kind = "make"

    def run(self, task: Task) -> Any:
        if "raise" in task.input:
            raise RuntimeError(task.input["raise"])
        if "depth" in task.input:
            value: Any = 0
            for _ in range(task.input["depth"]):
                value = [value]
            return {"nested": value}
        return {"text": "x" * task.input["bytes"]}


def start(client: redis.Redis, threads: Threads, input: Any) -> str:
    """Submit a make:it workflow and wait for its start-task (the lifecycle in a thread)."""
    threads.lifecycle()
    workflow = submit(client, "make:it", input)
    wait_until(lambda: client.xlen(KEYS.tasks("make")), what="the start-task")
    return workflow


def answers(client: redis.Redis) -> dict[str, dict[str, Any]]:
    return {e["workflow"]: e for _, e in events(client, KEYS.lifecycle, "end-task")}


def test_an_output_beyond_the_size_or_depth_limit_fails_its_task_and_the_worker_goes_on(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    threads.start(Maker(pool=threads.pool, handle_signals=False, block_ms=100))
    too_big = submit(redis_client, "make:it", {"bytes": DEFAULT_LIMITS.value_bytes})
    too_deep = submit(redis_client, "make:it", {"depth": DEFAULT_LIMITS.depth + 10})
    fine = submit(redis_client, "make:it", {"bytes": 10})

    big_end, deep_end = wait_for_end(redis_client, too_big), wait_for_end(redis_client, too_deep)
    assert big_end["status"] == "failed" and deep_end["status"] == "failed"
    assert wait_for_end(redis_client, fine) == {"status": "finished", "output": {"text": "x" * 10}}
    ends = answers(redis_client)
    assert ends[too_big]["error"] == (
        "output is 8,388,619 bytes, more than the limit of 8,388,608"  # {"text":"..."}
    )
    assert ends[too_deep]["error"] == "output nests deeper than 256 levels"
    starts = {e["workflow"]: e for _, e in events(redis_client, KEYS.tasks("make"))}
    for workflow in (too_big, too_deep):
        assert ends[workflow]["token"] == starts[workflow]["token"]  # a FAILURE that counts
    # Nothing of the oversized output reached Redis.
    largest = max(
        sum(len(v) for v in fields.values()) for _, fields in redis_client.xrange(KEYS.lifecycle)
    )
    assert largest < 10_000
    assert redis_client.xlen(dead_letter_key(KEYS.lifecycle)) == 0


def test_a_task_listeners_limits_can_be_set_lower(
    redis_url: str, redis_client: redis.Redis, threads: Threads
) -> None:
    worker = Maker(url=redis_url, handle_signals=False, block_ms=50)
    worker.limits = Limits(value_bytes=100)
    start(redis_client, threads, {"bytes": 200})
    worker.listen(idle_timeout=0.5)
    ((_, end),) = events(redis_client, KEYS.lifecycle, "end-task")
    assert end["status"] == "FAILURE" and "more than the limit of 100" in end["error"]


def test_a_failing_task_is_logged_in_one_line_at_info_and_its_traceback_at_debug(
    redis_url: str,
    redis_client: redis.Redis,
    threads: Threads,
    caplog: pytest.LogCaptureFixture,
) -> None:
    start(redis_client, threads, {"raise": "the disk is full"})
    with caplog.at_level(logging.DEBUG, logger="workers.task"):
        Maker(url=redis_url, handle_signals=False, block_ms=50).listen(idle_timeout=0.5)
    records = [r for r in caplog.records if r.name == "workers.task"]
    info = [r for r in records if r.levelno == logging.INFO]
    debug = [r for r in records if r.levelno == logging.DEBUG]
    assert len(info) == 1 and info[0].exc_info is None
    assert "RuntimeError: the disk is full" in info[0].getMessage()
    assert len(debug) == 1 and debug[0].exc_info is not None
    assert not [r for r in records if r.levelno >= logging.WARNING]


def test_a_huge_error_text_is_cut(
    redis_url: str, redis_client: redis.Redis, threads: Threads
) -> None:
    start(redis_client, threads, {"raise": "e" * 100_000})
    Maker(url=redis_url, handle_signals=False, block_ms=50).listen(idle_timeout=0.5)
    ((_, end),) = events(redis_client, KEYS.lifecycle, "end-task")
    assert end["status"] == "FAILURE" and end["error"].startswith("RuntimeError: eee")
    assert len(end["error"]) < 4200 and end["error"].endswith("(100,014 characters, cut)")
