"""Streams that appear while a listener runs: add_streams() and discover=."""

import threading

import pytest

from rqse import ConfigurationError, EventClient, EventListener, message
from tests.conftest import wait_until


class Collector(EventListener):
    def __init__(self, *args, **kw):
        kw.setdefault("block_ms", 100)
        super().__init__(*args, **kw)
        self.seen: list[tuple[str | None, str]] = []

    def process(self, event_id, event):
        self.seen.append((self.current_stream, event["text"]))
        return True


def append(redis_url, stream, text):
    EventClient(stream, url=redis_url).append(message({"text": text}, kind="note"))


def test_add_streams_while_listening_serves_what_the_new_stream_already_holds(
    redis_url, redis_client, run_listener
):
    listener = Collector("s:a", "g", url=redis_url)
    run = run_listener(listener)
    wait_until(lambda: listener.established, what="established")
    append(redis_url, "s:b", "before")  # written before the listener follows s:b
    listener.add_streams(["s:b", "s:a"])
    append(redis_url, "s:b", "after")
    append(redis_url, "s:a", "old stream")
    wait_until(lambda: len(listener.seen) == 3, what="three entries")
    run.stop()
    assert sorted(listener.seen) == [
        ("s:a", "old stream"),
        ("s:b", "after"),
        ("s:b", "before"),
    ]
    assert listener.streams == ("s:a", "s:b")
    assert redis_client.xpending("s:b", "g")["pending"] == 0


def test_discover_is_called_from_the_loop_and_new_streams_are_followed(
    redis_url, redis_client, run_listener
):
    wanted = ["s:a"]
    callers: set[str] = set()

    def discover():
        callers.add(threading.current_thread().name)
        return list(wanted)

    listener = Collector("s:a", "g", url=redis_url, discover=discover, discover_every=0.05)
    run = run_listener(listener)
    wait_until(lambda: listener.established, what="established")
    append(redis_url, "s:c", "waiting")
    wanted.append("s:c")
    wait_until(lambda: listener.seen, what="the entry of the discovered stream")
    run.stop()
    assert listener.seen == [("s:c", "waiting")]
    assert listener.streams == ("s:a", "s:c")
    # Only the listening thread reads Redis for the listener: discover runs there too.
    assert callers == {run.thread.name}


def test_discover_naming_nothing_new_changes_nothing(redis_url, redis_client):
    calls = []

    def discover():
        calls.append(1)
        return ["s:a"]

    listener = Collector("s:a", "g", url=redis_url, discover=discover, discover_every=0.05)
    listener.listen(idle_timeout=0.3)
    assert len(calls) >= 3
    assert listener.streams == ("s:a",)
    assert redis_client.keys("s:*") == [b"s:a"]


def test_a_failing_discover_is_logged_and_the_listener_keeps_serving(
    redis_url, redis_client, run_listener, caplog
):
    def discover():
        raise RuntimeError("kinds unreadable")

    listener = Collector("s:a", "g", url=redis_url, discover=discover, discover_every=0.05)
    run = run_listener(listener)
    wait_until(lambda: listener.established, what="established")
    append(redis_url, "s:a", "still served")
    wait_until(lambda: listener.seen, what="the entry")
    run.stop()
    assert "discovering streams failed" in caplog.text
    assert "kinds unreadable" in caplog.text


def test_a_restarted_consumer_recovers_its_pending_entries_of_discovered_streams(
    redis_url, redis_client
):
    append(redis_url, "s:d", "held")
    redis_client.xgroup_create("s:d", "g", id="0")
    redis_client.xreadgroup("g", "stable", {"s:d": ">"})  # delivered, never acknowledged
    listener = Collector(
        "s:a", "g", consumer="stable", url=redis_url, discover=lambda: ["s:d"], claim_idle=60
    )
    assert listener.listen(max_events=1) == 1
    assert listener.seen == [("s:d", "held")]
    assert listener.stats.recovered == 1


def test_stream_options_are_checked(redis_url):
    with pytest.raises(ConfigurationError, match="discover_every must be positive, got 0"):
        Collector("s:a", "g", url=redis_url, discover=list, discover_every=0)
    with pytest.raises(ConfigurationError, match="discover must be callable, got 'x'"):
        Collector("s:a", "g", url=redis_url, discover="x")
    with pytest.raises(ValueError, match="non-empty string, got b's:b'"):
        Collector("s:a", "g", url=redis_url).add_streams([b"s:b"])
