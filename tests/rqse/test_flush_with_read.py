"""flush_with_next_read: a batch's writes go in the round trip of the next read."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from rqse import EventClient, EventListener, fastpipe, message
from rqse import listener as listener_module
from rqse.backoff import Backoff
from rqse.keys import dead_letter_key
from tests.conftest import wait_until


class Echo(EventListener):
    """Answers each job on ``out``; its writes wait for the next read."""

    flush_with_next_read = True

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("block_ms", 50)
        kw.setdefault("handle_signals", False)
        super().__init__(*args, **kw)
        self.seen: list[int] = []

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        self.seen.append(event["n"])
        self.emit(message({"n": event["n"]}, kind="answer"), "out")
        return True


@pytest.fixture
def jobs(redis_url: str) -> EventClient:
    return EventClient("jobs", url=redis_url)


def test_each_batch_costs_one_round_trip_that_writes_the_last_and_reads_the_next(
    jobs: EventClient, redis_url: str, redis_client: redis.Redis, monkeypatch: Any
) -> None:
    jobs.append_many([message({"n": n}, kind="job") for n in range(6)])
    trips: list[list[str]] = []
    real = fastpipe.send

    def counted(connection: Any, commands: Any) -> None:
        trips.append([c[0] for c in commands])
        real(connection, commands)

    monkeypatch.setattr(listener_module, "send", counted)
    listener = Echo("jobs", "g", url=redis_url, batch_size=2)
    assert listener.listen(max_events=6, idle_timeout=1.0) == 6
    # Batches 1 and 2 were written with the reads of batches 2 and 3; batch 3's writes
    # went alone as listen() returned.
    assert trips == [["MULTI", "XADD", "XADD", "XACK", "EXEC", "XREADGROUP"]] * 2
    assert redis_client.xlen("out") == 6
    assert redis_client.xpending("jobs", "g")["pending"] == 0
    assert listener.seen == list(range(6))


def test_a_batchs_writes_land_at_once_though_the_read_behind_them_blocks(
    jobs: EventClient, redis_url: str, redis_client: redis.Redis, run_listener: Any
) -> None:
    listener = Echo("jobs", "g", url=redis_url, batch_size=5, block_ms=5000)
    running = run_listener(listener)
    jobs.append_many([message({"n": n}, kind="job") for n in range(3)])
    wait_until(lambda: redis_client.xlen("out") == 3, timeout=2.0, what="answers written")
    wait_until(lambda: redis_client.xpending("jobs", "g")["pending"] == 0, timeout=2.0)
    assert running.thread.is_alive()  # blocked in the read the writes went with
    started = time.monotonic()
    running.stop()  # and that read is cut short
    assert time.monotonic() - started < 2.0


def test_a_stop_between_batches_still_writes_the_last_one(
    jobs: EventClient, redis_url: str, redis_client: redis.Redis, run_listener: Any
) -> None:
    listener = Echo("jobs", "g", url=redis_url, batch_size=5)
    running = run_listener(listener)
    jobs.append_many([message({"n": n}, kind="job") for n in range(3)])
    wait_until(lambda: len(listener.seen) == 3, what="three jobs handled")
    running.stop()
    assert redis_client.xlen("out") == 3
    assert redis_client.xpending("jobs", "g")["pending"] == 0


def test_writes_refused_with_the_next_read_leave_both_batches_pending_uncounted(
    jobs: EventClient, redis_url: str, redis_client: redis.Redis, monkeypatch: Any
) -> None:
    jobs.append_many([message({"n": n}, kind="job") for n in range(4)])
    listener = Echo(
        "jobs", "g", url=redis_url, batch_size=2, max_deliveries=1, reconnect=Backoff(0.02, 0.1)
    )
    real_send, real_read = fastpipe.send, fastpipe.read
    struck: list[bool] = []

    def send(connection: Any, commands: Any) -> None:
        if not struck:  # the first writes with a read: Redis is full as they arrive
            redis_client.config_set("maxmemory", 1)
        real_send(connection, commands)

    def read(connection: Any, count: int) -> list[Any]:
        replies = real_read(connection, count)
        if not struck:
            struck.append(True)
            redis_client.config_set("maxmemory", 0)
        return replies

    monkeypatch.setattr(listener_module, "send", send)
    monkeypatch.setattr(listener_module, "read", read)
    listener.listen(idle_timeout=1.0)  # batch 1 is handled twice: not max_events=4
    # Refused writes are Redis weather: nothing is counted towards max_deliveries=1 (the
    # jobs the read behind them brought included), so nothing is dead-lettered, and
    # every job ends answered and acknowledged.
    assert struck and listener.stats.reconnects >= 1 and listener.stats.dead_lettered == 0
    assert redis_client.xlen(dead_letter_key("jobs")) == 0
    assert sorted(int(f[b"n"]) for _, f in redis_client.xrange("out")) == [0, 1, 2, 3]
    assert redis_client.xpending("jobs", "g")["pending"] == 0
