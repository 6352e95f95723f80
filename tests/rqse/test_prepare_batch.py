"""prepare_batch(): one look at a batch's raw entries before any is handled."""

import pytest

from rqse import EventClient, EventListener, message


class SetAside(EventListener):
    """Sets aside entries whose raw ``text`` is ``"skip"``; records what it sees."""

    def __init__(self, *args, fail=False, **kw):
        kw.setdefault("block_ms", 50)
        super().__init__(*args, **kw)
        self.batches: list[list[bytes]] = []
        self.processed: list[str] = []
        self.fail = fail

    def prepare_batch(self, stream, entries):
        if self.fail:
            raise RuntimeError("lookup failed")
        self.batches.append([entry_id for entry_id, _ in entries])
        return {entry_id for entry_id, fields in entries if fields.get(b"text") == b'"skip"'}

    def process(self, event_id, event):
        self.processed.append(event["text"])
        return True


@pytest.fixture
def client(redis_url, redis_client):
    with EventClient("jobs", url=redis_url) as client:
        yield client


def test_entries_set_aside_by_prepare_batch_are_acknowledged_without_process(
    client, redis_url, redis_client
):
    ids = client.append_many(
        [message({"text": t}, kind="note") for t in ("run", "skip", "run too", "skip")]
    )
    listener = SetAside("jobs", "g", url=redis_url, batch_size=10)
    assert listener.listen(max_events=4, idle_timeout=1.0) == 4
    assert listener.processed == ["run", "run too"]
    assert listener.stats.ignored == 2 and listener.stats.processed == 2
    assert listener.batches == [[i.encode() for i in ids]]  # one call for the whole batch
    assert redis_client.xpending("jobs", "g")["pending"] == 0


def test_a_raising_prepare_batch_leaves_the_whole_batch_pending(client, redis_url, redis_client):
    client.append_many([message({"text": "a"}, kind="note"), message({"text": "b"}, kind="note")])
    listener = SetAside("jobs", "g", url=redis_url, batch_size=10, fail=True)
    with pytest.raises(RuntimeError, match="lookup failed"):
        listener.listen(max_events=2, idle_timeout=1.0)
    assert listener.processed == []
    assert redis_client.xpending("jobs", "g")["pending"] == 2


class ReadsAlong(SetAside):
    """Sends a GET of ``flag`` and a command Redis refuses along with each read."""

    read_along = (("GET", "flag"), ("NOSUCHCOMMAND",))

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.replies: list = []

    def prepare_batch(self, stream, entries):
        self.replies.append(self.read_replies)
        return super().prepare_batch(stream, entries)


def test_read_along_replies_reach_prepare_batch_in_the_reads_round_trip(
    client, redis_url, redis_client
):
    redis_client.set("flag", "up")
    client.append_many([message({"text": "a"}, kind="note"), message({"text": "b"}, kind="note")])
    listener = ReadsAlong("jobs", "g", url=redis_url, batch_size=10)
    assert listener.listen(max_events=2, idle_timeout=1.0) == 2
    ((flag, refused),) = listener.replies
    assert flag == b"up"
    assert "unknown command" in str(refused).lower()
    assert listener.read_replies is None  # only while a read's entries are handled
    assert listener.processed == ["a", "b"]


def test_claimed_entries_come_without_read_along_replies(client, redis_url, redis_client):
    client.append(message({"text": "left"}, kind="note"))
    redis_client.xgroup_create("jobs", "g", id="0")
    redis_client.xreadgroup("g", "crashed", {"jobs": ">"})  # pending on a consumer gone
    listener = ReadsAlong("jobs", "g", url=redis_url, claim_idle=0.05, batch_size=10)
    assert listener.listen(max_events=1, idle_timeout=2.0) == 1
    assert listener.processed == ["left"]
    assert listener.replies == [None]
