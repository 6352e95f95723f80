"""Several streams read by one group, in an order: the ``order`` option."""

import pytest

from rqse import ConfigurationError, EventClient, EventListener, message
from tests.conftest import wait_until

RANK = {"s:urgent": 0, "s:normal": 1, "s:later": 2}


class Collector(EventListener):
    def __init__(self, *args, **kw):
        kw.setdefault("block_ms", 50)
        kw.setdefault("handle_signals", False)
        super().__init__(*args, **kw)
        self.seen: list[str] = []

    def process(self, event_id, event):
        self.seen.append(event["text"])
        return True


def fill(redis_url, stream, *texts):
    client = EventClient(stream, url=redis_url)
    for text in texts:
        client.append(message({"text": text}, kind="note"))


def test_one_read_takes_a_batch_of_each_stream_and_handles_them_in_order(redis_url):
    fill(redis_url, "s:later", "l1", "l2")
    fill(redis_url, "s:normal", "n1", "n2")
    fill(redis_url, "s:urgent", "u1", "u2")
    listener = Collector(
        ["s:later", "s:normal", "s:urgent"], "g", url=redis_url, batch_size=1, order=RANK.get
    )
    assert listener.streams == ("s:urgent", "s:normal", "s:later")
    assert listener.key == "s:later"  # the default stream of emit() stays the one named first
    listener.listen(max_events=6)
    assert listener.seen == ["u1", "n1", "l1", "u2", "n2", "l2"]


def test_a_stream_joined_later_takes_its_place_in_the_order(redis_url, run_listener):
    listener = Collector(["s:later", "s:normal"], "g", url=redis_url, order=RANK.get)
    run = run_listener(listener)
    wait_until(lambda: listener.established, what="established")
    listener.add_streams("s:urgent")
    wait_until(lambda: "s:urgent" in listener.streams, what="the stream joined")
    run.stop()
    assert listener.streams == ("s:urgent", "s:normal", "s:later")


def test_pending_entries_of_every_stream_are_claimed_from_a_dead_consumer(redis_url, redis_client):
    fill(redis_url, "s:normal", "n1")
    fill(redis_url, "s:urgent", "u1")
    for stream in ("s:normal", "s:urgent"):
        redis_client.xgroup_create(stream, "g", id="0")
    # read by a consumer that then died without acknowledging either
    redis_client.xreadgroup("g", "dead", {"s:normal": ">", "s:urgent": ">"})
    listener = Collector(
        ["s:normal", "s:urgent"], "g", url=redis_url, order=RANK.get, claim_idle=0.2
    )
    listener.listen(max_events=2, idle_timeout=5)
    assert sorted(listener.seen) == ["n1", "u1"]
    for stream in ("s:normal", "s:urgent"):
        assert redis_client.xpending(stream, "g")["pending"] == 0


def test_order_must_be_callable(redis_url):
    with pytest.raises(ConfigurationError, match="order must be callable, got 3"):
        Collector("s:a", "g", url=redis_url, order=3)
