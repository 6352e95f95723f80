"""Listeners in child processes: SIGKILL mid-batch, graceful and forced shutdown."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rqse import EventClient, EventListener, message
from tests.conftest import wait_until

CHILD = Path(__file__).with_name("child_listener.py")


@pytest.fixture
def spawn(redis_url):
    children: list[subprocess.Popen[bytes]] = []

    def start(consumer: str, hang_at: int, mode: str = "wait") -> subprocess.Popen[bytes]:
        child = subprocess.Popen(
            [sys.executable, str(CHILD), redis_url, "jobs", "g", consumer, str(hang_at), mode],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stderr:
            child.stderr.close()


class Recorder(EventListener):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.seen: list[int] = []

    def process(self, event_id, event):
        self.seen.append(event["n"])
        return True


def done(redis_client) -> list[int]:
    return [int(n) for n in redis_client.lrange("done", 0, -1)]


def pending_of(redis_client, consumer: str) -> int:
    return len(redis_client.xpending_range("jobs", "g", "-", "+", 100, consumername=consumer))


def test_a_listener_killed_mid_batch_loses_nothing(redis_url, redis_client, spawn, run_listener):
    client = EventClient("jobs", url=redis_url)
    client.append_many([message({"n": n}, kind="job") for n in range(20)])
    victim = spawn("victim", hang_at=5)
    wait_until(lambda: redis_client.llen("started"), what="victim holding event 5")
    assert done(redis_client) == [0, 1, 2, 3, 4]
    assert pending_of(redis_client, "victim") == 10, "the whole batch is held, unacknowledged"

    victim.send_signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL

    rescuer = Recorder("jobs", "g", consumer="rescuer", url=redis_url, claim_idle=0.2)
    run = run_listener(rescuer)
    wait_until(lambda: sorted(rescuer.seen) == list(range(20)), what="all 20 events processed")
    run.stop()
    assert rescuer.stats.claimed == 10
    assert redis_client.xpending("jobs", "g")["pending"] == 0
    assert not redis_client.exists("stopped"), "SIGKILL runs no hook"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_finishes_the_event_in_hand_acknowledges_and_exits(
    redis_url, redis_client, spawn, signum
):
    client = EventClient("jobs", url=redis_url)
    ids = client.append_many([message({"n": n}, kind="job") for n in range(5)])
    child = spawn("graceful", hang_at=1)
    wait_until(lambda: redis_client.llen("started"), what="child holding event 1")

    child.send_signal(signum)
    assert child.wait(10) == 0, child.stderr.read().decode() if child.stderr else ""
    assert done(redis_client) == [0, 1], "the event in hand finished, no other started"
    assert redis_client.get("stopped") == b"graceful"
    held = [
        p["message_id"].decode()
        for p in redis_client.xpending_range("jobs", "g", "-", "+", 100, consumername="graceful")
    ]
    assert held == ids[2:], "0 and 1 acknowledged; the unstarted rest stays with its consumer"

    # Same consumer name again: it picks up what it held, first.
    again = Recorder("jobs", "g", consumer="graceful", url=redis_url)
    again.listen(max_events=3)
    assert again.seen == [2, 3, 4]


def test_a_second_signal_exits_at_once(redis_url, redis_client, spawn):
    client = EventClient("jobs", url=redis_url)
    ids = client.append_many([message({"n": n}, kind="job") for n in range(3)])
    child = spawn("stuck", hang_at=0, mode="stuck")
    wait_until(lambda: redis_client.llen("started"), what="child holding event 0")
    child.send_signal(signal.SIGTERM)
    wait_until(lambda: redis_client.llen("stopping"), what="first signal seen, task ignores it")
    child.send_signal(signal.SIGTERM)
    assert child.wait(10) == 128 + signal.SIGTERM
    assert done(redis_client) == []
    assert not redis_client.exists("stopped"), "no onStop after a forced exit"
    pending = redis_client.xpending_range("jobs", "g", "-", "+", 10)
    held = [p["message_id"].decode() for p in pending]
    assert held == ids, "the interrupted event stays pending for redelivery"
