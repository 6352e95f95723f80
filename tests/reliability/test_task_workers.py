"""Task workers as real processes: a stalled holder is fenced, a slow live one is not."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from rqse.keys import dead_letter_key
from tests.conftest import wait_until
from tests.processes import Processes
from tests.workers import conftest as workers_fixtures
from tests.workers.helpers import KEYS, Threads, events, submit
from tests.workers.sample import SLEEPER_RUNS

threads = workers_fixtures.threads  # the fixture, shared rather than a conftest here

FLOW = "sleepy:nap → next"  # `next` is of kind default: its start-task waits, unserved


def sleeper(processes: Processes, consumer: str) -> subprocess.Popen[bytes]:
    return processes.start(
        "workers", "run", "tests.workers.sample:Sleeper", "--consumer", consumer,
        "--claim-idle", "1",
    )  # fmt: skip


def runs(client: redis.Redis) -> list[str]:
    return [name.decode() for name in client.lrange(SLEEPER_RUNS, 0, -1)]


def next_started(client: redis.Redis, workflow: str) -> list[dict]:
    """The start-tasks of the workflow's second node."""
    return [e for _, e in events(client, KEYS.tasks("default")) if e["workflow"] == workflow]


def consumers(client: redis.Redis) -> int:
    """How many consumers the sleepy kind's group has (0 before its first worker made it)."""
    try:
        return len(client.xinfo_consumers(KEYS.tasks("sleepy"), "workers"))
    except redis.ResponseError:  # no stream or no group yet
        return 0


@contextmanager
def stopped(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """SIGSTOP ``proc`` (a stall: alive, holding its work, renewing nothing) until the
    block ends; SIGCONT whatever happens."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def test_a_stalled_holders_late_answer_is_dead_lettered_and_the_workflow_advances_once(
    redis_client: redis.Redis, threads: Threads, processes: Processes
) -> None:
    threads.lifecycle()
    a = sleeper(processes, "sleeper-a")
    workflow = submit(redis_client, FLOW, {"seconds": 1.5})
    wait_until(lambda: runs(redis_client) == ["sleeper-a"], timeout=15, what="a to take the task")
    with stopped(a):
        sleeper(processes, "sleeper-b")  # takes the task over once it is idle for 1 s
        (started,) = wait_until(
            lambda: next_started(redis_client, workflow), timeout=15, what="b's answer"
        )
        assert started["input"] == {"by": "sleeper-b"}
    # a wakes with its sleep long over and answers at once: too late.
    dead_key = dead_letter_key(KEYS.lifecycle)
    (dead,) = wait_until(
        lambda: events(redis_client, dead_key), timeout=15, what="a's answer dead-lettered"
    )
    _, letter = dead
    assert "a second answer?" in letter["error"] and workflow in letter["error"]
    answers = [e for _, e in events(redis_client, KEYS.lifecycle, "end-task")]
    assert [e["worker"] for e in answers] == ["sleeper-b", "sleeper-a"]
    assert answers[0]["token"] == answers[1]["token"]  # the right token, yet refused
    assert runs(redis_client) == ["sleeper-a", "sleeper-b"]
    assert len(next_started(redis_client, workflow)) == 1
    assert redis_client.xpending(KEYS.tasks("sleepy"), "workers")["pending"] == 0


def test_a_live_holder_slower_than_claim_idle_keeps_its_task(
    redis_client: redis.Redis, threads: Threads, processes: Processes
) -> None:
    threads.lifecycle()
    for name in ("sleeper-a", "sleeper-b"):
        sleeper(processes, name)
    wait_until(lambda: consumers(redis_client) == 2, timeout=15, what="both sleepers")
    workflow = submit(redis_client, FLOW, {"seconds": 3.5})  # over three claim_idles
    (started,) = wait_until(
        lambda: next_started(redis_client, workflow), timeout=20, what="the answer"
    )
    (holder,) = runs(redis_client)  # ran once: the peer, scanning, never took it
    assert started["input"] == {"by": holder}
    assert len(events(redis_client, KEYS.lifecycle, "end-task")) == 1
    assert redis_client.xlen(dead_letter_key(KEYS.lifecycle)) == 0
