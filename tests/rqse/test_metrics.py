"""rqse.metrics: per-stream outcomes of a real listener, round trips of a real pool,
served over real HTTP."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from rqse import EventListener
from rqse.errors import ConfigurationError
from rqse.metrics import ListenerMetrics, RoundTrips, serve
from tests.scrape import free_port, scrape


class Picky(EventListener):
    """Processes ``ok``, declines ``no``, fails ``boom`` (dead-lettered on its only delivery)."""

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        if event["kind"] == "boom":
            raise ValueError("boom")
        return bool(event["kind"] == "ok")


def test_events_are_counted_per_stream_and_outcome_and_served_over_http(
    redis_client: redis.Redis, redis_url: str
) -> None:
    for n in range(7):
        redis_client.xadd("a", {"kind": '"ok"', "n": str(n)})
    redis_client.xadd("a", {"kind": '"no"'})
    redis_client.xadd("a", {"kind": "not json"})  # malformed: dead-lettered
    redis_client.xadd("b", {"kind": '"boom"'})  # fails on its last delivery: dead-lettered
    redis_client.xadd("b", {"kind": '"other"'})  # not selected: ignored
    for _ in range(3):
        redis_client.xadd("b", {"kind": '"ok"'})
    listener = Picky(
        ["a", "b"],
        "g",
        ["ok", "no", "boom"],
        url=redis_url,
        handle_signals=False,
        max_deliveries=1,
        batch_size=4,
    )
    registry = CollectorRegistry()
    metrics = ListenerMetrics("test")
    metrics.watch(listener)
    registry.register(metrics)
    server = serve(registry, free_port())
    try:
        assert listener.listen(max_events=14, idle_timeout=5) == 14
        samples = scrape(server.port)
    finally:
        server.stop()

    def events(stream: str, outcome: str) -> float:
        key = (("group", "g"), ("outcome", outcome), ("stream", stream))
        return samples[("test_events_total", key)]

    assert [events("a", o) for o in ("processed", "declined", "dead_lettered")] == [7, 1, 1]
    assert [events("b", o) for o in ("processed", "ignored", "failed", "dead_lettered")] == [
        3,
        1,
        1,
        1,
    ]
    assert events("a", "failed") == events("a", "ignored") == 0
    received = {
        s: samples[("test_events_received_total", (("group", "g"), ("stream", s)))] for s in "ab"
    }
    assert received == {"a": 9, "b": 5}
    assert samples[("test_listener_reconnects_total", (("group", "g"),))] == 0


def test_a_listener_not_watched_keeps_no_per_stream_counts(redis_url: str) -> None:
    listener = Picky("a", "g", url=redis_url, handle_signals=False)
    listener.connection.xadd("a", {"kind": '"ok"'})
    listener.listen(max_events=1, idle_timeout=5)
    assert listener.stream_stats is None and listener.stats.processed == 1


def test_round_trips_count_one_per_command_or_pipeline_sent(redis_url: str) -> None:
    pool = redis.ConnectionPool.from_url(redis_url)
    client = redis.Redis(connection_pool=pool)
    client.ping()  # a connection made before counting: dropped, so the next one counts
    trips = RoundTrips("test")
    trips.count(pool)
    trips.count(pool)  # twice: still one count per round trip
    client.ping()  # a new connection: its handshake (CLIENT SETINFO ...) counts too
    connected = trips.total()
    assert connected >= 1
    client.ping()
    assert trips.total() == connected + 1
    pipe = client.pipeline(transaction=False)
    for n in range(50):
        pipe.set(f"k{n}", n)
    pipe.execute()
    assert trips.total() == connected + 2
    client.set("x", 1)
    client.get("x")
    assert trips.total() == connected + 4
    pool.disconnect()


def test_a_metrics_port_in_use_is_one_line_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigurationError) as error:
            serve(CollectorRegistry(), port)
    message = str(error.value)
    assert "\n" not in message
    assert f"--metrics-port {port}" in message and f"127.0.0.1:{port}" in message
    assert "in use" in message
