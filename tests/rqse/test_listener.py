import json
import threading
import time
from collections import Counter

import pytest

from rqse import ConfigurationError, EventClient, EventListener, RedisCommandError, message
from tests.conftest import wait_until


class Recorder(EventListener):
    """Records (event_id, kind) and answers from a kind -> result table."""

    def __init__(self, *args, results=None, **kw):
        kw.setdefault("claim_idle", 0.2)
        super().__init__(*args, **kw)
        self.seen: list[tuple[str, str]] = []
        self.results = results or {}

    def process(self, event_id, event):
        self.seen.append((event_id, event["kind"]))
        result = self.results.get(event["kind"], True)
        if isinstance(result, Exception):
            raise result
        return result


@pytest.fixture
def client(redis_url, redis_client):
    with EventClient("jobs", url=redis_url) as client:
        yield client


def pending_ids(redis_client, group, key="jobs"):
    pending = redis_client.xpending_range(key, group, "-", "+", 1000)
    return [p["message_id"].decode() for p in pending]


def test_true_acknowledges_and_false_acknowledges_as_declined(client, redis_url, redis_client):
    client.append_many([message(kind="mine"), message(kind="theirs"), message(kind="mine")])
    listener = Recorder("jobs", "g", url=redis_url, results={"theirs": False})
    assert listener.listen(max_events=3) == 3
    assert (listener.stats.processed, listener.stats.declined) == (2, 1)
    assert pending_ids(redis_client, "g") == []


def test_kinds_outside_select_are_acknowledged_without_calling_process(
    client, redis_url, redis_client
):
    client.append_many([message(kind="start-task"), message(kind="end-task")])
    listener = Recorder("jobs", "g", select=["start-task"], url=redis_url)
    listener.listen(max_events=2)
    assert [kind for _, kind in listener.seen] == ["start-task"]
    assert listener.stats.ignored == 1
    assert pending_ids(redis_client, "g") == []


def test_kinds_outside_select_are_dead_lettered_on_a_stream_only_selected_kinds_belong_on(
    client, redis_url, redis_client
):
    client.append_many([message(kind="end-task"), message(kind="start-task")])
    listener = Recorder(
        "jobs", "g", select=["start-task"], dead_letter_unselected=True, url=redis_url
    )
    listener.listen(max_events=2)
    assert [kind for _, kind in listener.seen] == ["start-task"]
    [(_, dead)] = redis_client.xrange("jobs:dead")
    assert json.loads(dead[b"reason"]) == "unselected"
    assert (listener.stats.ignored, listener.stats.dead_lettered) == (0, 1)
    assert pending_ids(redis_client, "g") == []


def test_a_reader_that_does_not_own_the_stream_still_ignores_unselected_kinds(
    client, redis_url, redis_client
):
    client.append_many([message(kind="end-task")])
    listener = Recorder(
        "jobs", "g", select=["start-task"], dead_letter_unselected=True, own_garbage=False,
        url=redis_url,
    )  # fmt: skip
    listener.listen(max_events=1)
    assert listener.stats.ignored == 1
    assert redis_client.exists("jobs:dead") == 0


def test_group_creation_is_idempotent_and_concurrent_creators_do_not_fail(redis_url, redis_client):
    listeners = [Recorder("fresh", "g", url=redis_url) for _ in range(8)]
    barrier = threading.Barrier(len(listeners))
    errors = []

    def establish(listener):
        barrier.wait()
        try:
            listener.listen(idle_timeout=0.01)
        except Exception as e:  # pragma: no cover - the assertion reports it
            errors.append(e)

    threads = [threading.Thread(target=establish, args=(lst,)) for lst in listeners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    [group] = redis_client.xinfo_groups("fresh")
    assert group["name"] == b"g"


def test_a_second_listener_keeps_the_group_position(client, redis_url):
    client.append(message(kind="k"))
    Recorder("jobs", "g", url=redis_url).listen(max_events=1)
    later = Recorder("jobs", "g", url=redis_url)
    later.listen(idle_timeout=0.05)
    assert later.seen == []


def test_two_listeners_in_one_group_share_work_without_duplicates(client, redis_url, run_listener):
    client.append_many([message({"n": n}, kind="job") for n in range(200)])
    both_busy = threading.Barrier(2, timeout=10)
    done: list[tuple[str, str]] = []
    lock = threading.Lock()

    class Sharing(EventListener):
        first = True

        def process(self, event_id, event):
            if self.first:  # each holds a batch until the other has one too
                self.first = False
                both_busy.wait()
            with lock:
                done.append((event_id, self.consumer))
            return True

    a = Sharing("jobs", "workers", consumer="a", batch_size=10, url=redis_url)
    b = Sharing("jobs", "workers", consumer="b", batch_size=10, url=redis_url)
    runs = [run_listener(a), run_listener(b)]
    wait_until(lambda: len(done) >= 200, what="200 events processed")
    for run in runs:
        run.stop()
    assert len(done) == 200
    assert len({event_id for event_id, _ in done}) == 200, "an event was processed twice"
    per_consumer = Counter(consumer for _, consumer in done)
    assert per_consumer["a"] > 0 and per_consumer["b"] > 0


def test_a_restarted_consumer_first_reprocesses_its_own_pending_entries(
    client, redis_url, redis_client
):
    held = client.append_many([message({"n": n}, kind="k") for n in range(3)])
    redis_client.xgroup_create("jobs", "g", id="0")
    redis_client.xreadgroup("g", "worker-1", {"jobs": ">"}, count=3)  # then "crashed"
    newer = client.append_many([message({"n": n}, kind="k") for n in range(3, 5)])
    listener = Recorder("jobs", "g", consumer="worker-1", url=redis_url)
    listener.listen(max_events=5)
    assert [event_id for event_id, _ in listener.seen] == held + newer
    assert listener.stats.recovered == 3
    assert pending_ids(redis_client, "g") == []


def test_entries_idle_on_another_consumer_are_claimed(
    client, redis_url, redis_client, run_listener
):
    ids = client.append_many([message({"n": n}, kind="k") for n in range(4)])
    redis_client.xgroup_create("jobs", "g", id="0")
    redis_client.xreadgroup("g", "dead-consumer", {"jobs": ">"}, count=4)
    listener = Recorder("jobs", "g", consumer="rescuer", url=redis_url, claim_idle=0.1)
    run = run_listener(listener)
    wait_until(lambda: len(listener.seen) == 4, what="claimed entries processed")
    run.stop()
    assert sorted(event_id for event_id, _ in listener.seen) == ids
    assert listener.stats.claimed == 4
    assert pending_ids(redis_client, "g") == []


def test_a_long_process_keeps_its_entries_from_being_claimed(client, redis_url, run_listener):
    client.append(message(kind="slow"))
    release = threading.Event()
    started = threading.Event()

    class Slow(Recorder):
        def process(self, event_id, event):
            started.set()
            release.wait(10)
            return super().process(event_id, event)

    slow = Slow("jobs", "g", consumer="slow", url=redis_url, claim_idle=0.15)
    other = Recorder("jobs", "g", consumer="other", url=redis_url, claim_idle=0.15)
    runs = [run_listener(slow)]
    started.wait(10)
    runs.append(run_listener(other))
    # Several claim scans, each long after claim_idle would have expired.
    wait_until(lambda: other.stats.claim_scans >= 8, what="claim scans by the other consumer")
    release.set()
    wait_until(lambda: slow.seen, what="slow event done")
    for run in runs:
        run.stop()
    assert other.seen == [] and other.stats.claimed == 0


def test_a_failing_event_stays_pending_and_is_retried(
    client, redis_url, redis_client, run_listener
):
    entry_id = client.append(message(kind="flaky"))
    attempts = []

    class Flaky(EventListener):
        def process(self, event_id, event):
            attempts.append(event_id)
            if len(attempts) < 3:
                raise ConnectionAbortedError("upstream hiccup")
            return True

    listener = Flaky("jobs", "g", url=redis_url, claim_idle=0.05, max_deliveries=5)
    run = run_listener(listener)
    wait_until(lambda: listener.stats.processed == 1, what="third attempt succeeds")
    run.stop()
    assert attempts == [entry_id] * 3
    assert listener.stats.failed == 2
    assert pending_ids(redis_client, "g") == []
    assert redis_client.xlen("jobs:dead") == 0


def test_emitted_events_are_written_with_the_acknowledgement(client, redis_url, redis_client):
    client.append(message({"n": 1}, kind="start"))

    class Chain(EventListener):
        def process(self, event_id, event):
            self.emit(message({"n": event["n"] + 1}, kind="next", response_for=event_id))
            self.emit(message(kind="audit"), key="audit")
            # not yet visible: written with the acknowledgement
            assert redis_client.xlen("audit") == 0
            return True

    Chain("jobs", "g", select=["start"], url=redis_url).listen(max_events=1)
    assert [e["kind"] for _, e in client.range(count=None)] == ["start", "next"]
    assert redis_client.xlen("audit") == 1


def test_stop_from_another_thread_cuts_a_blocking_read_short(redis_url, redis_client, run_listener):
    listener = Recorder("jobs", "g", url=redis_url, block_ms=4000, claim_idle=60)
    run = run_listener(listener)
    wait_until(lambda: listener.established, what="listener established")
    wait_until(lambda: listener._blocking, what="listener blocked in XREADGROUP")
    started = time.monotonic()
    run.stop()
    listener.stop()  # idempotent
    assert time.monotonic() - started < 1.0


def test_an_idle_listener_wakes_on_the_next_entry(client, redis_url, run_listener):
    listener = Recorder("jobs", "g", url=redis_url, block_ms=4000, claim_idle=60)
    run = run_listener(listener)
    wait_until(lambda: listener._blocking, what="listener blocked in XREADGROUP")
    appended = time.monotonic()
    client.append(message(kind="k"))
    wait_until(lambda: listener.seen, what="event processed")
    assert time.monotonic() - appended < 0.5, "waited for the block timeout instead of waking"
    run.stop()


def test_hooks_run_in_order(client, redis_url):
    calls = []

    class Hooked(EventListener):
        def onStart(self):
            calls.append("start")

        def onEstablished(self):
            calls.append("established")

        def process(self, event_id, event):
            calls.append("process")
            return True

        def onStop(self):
            calls.append("stop")

    client.append(message(kind="k"))
    Hooked("jobs", "g", url=redis_url).listen(max_events=1)
    assert calls == ["start", "established", "process", "stop"]


def test_one_listener_can_read_several_streams(redis_url, redis_client):
    EventClient("tasks:a", url=redis_url).append(message(kind="a"))
    EventClient("tasks:b", url=redis_url).append(message(kind="b"))
    streams = []

    class Multi(Recorder):
        def process(self, event_id, event):
            streams.append(self.current_stream)
            return super().process(event_id, event)

    listener = Multi(["tasks:a", "tasks:b"], "g", url=redis_url)
    assert listener.listen(max_events=2) == 2
    assert sorted(streams) == ["tasks:a", "tasks:b"]
    assert listener.key == "tasks:a"


def test_a_stream_deleted_under_a_listener_is_recreated(client, redis_url, run_listener):
    listener = Recorder("jobs", "g", url=redis_url, block_ms=50)
    run = run_listener(listener)
    wait_until(lambda: listener.established, what="established")
    client.delete_stream()
    wait_until(lambda: client.connection.exists("jobs"), what="stream re-created")
    client.append(message(kind="after"))
    wait_until(lambda: listener.seen, what="event after re-creation")
    run.stop()


def test_options_are_checked_at_construction(redis_url):
    with pytest.raises(ConfigurationError, match="max_deliveries must be positive, got 0"):
        Recorder("jobs", "g", url=redis_url, max_deliveries=0)
    with pytest.raises(ConfigurationError, match="socket_timeout"):
        Recorder("jobs", "g", url=redis_url, block_ms=60_000)
    with pytest.warns(DeprecationWarning, match="polling options"):
        Recorder("jobs", "g", url=redis_url, wait=10, idle_count=5)
    with pytest.raises(TypeError, match="colour"):
        Recorder("jobs", "g", url=redis_url, colour="blue")


def test_a_key_of_the_wrong_type_ends_listen_with_a_clear_error(redis_url, redis_client):
    redis_client.set("jobs", "not a stream")
    with pytest.raises(RedisCommandError, match="consumer c of group g on jobs") as caught:
        Recorder("jobs", "g", consumer="c", url=redis_url).listen(idle_timeout=1)
    assert "WRONGTYPE" in str(caught.value) or "wrong kind" in str(caught.value)


@pytest.mark.parametrize("protocol", [2, 3])
def test_new_entries_are_read_and_decoded_alike_under_both_protocols(client, redis_url, protocol):
    """The listener takes XREADGROUP's reply raw from the parser (RESP2: a list of
    streams, RESP3: a map); both give the same events, in order, on both streams."""
    other = EventClient("jobs-2", url=redis_url)
    client.append_many([message({"n": i, "nested": {"x": [i]}}, kind="mine") for i in range(5)])
    other.append(message({"n": 99}, kind="mine"))

    class Keeper(Recorder):
        def process(self, event_id, event):
            self.events.append((self.current_stream, event["n"], event.get("nested")))
            return True

    listener = Keeper(["jobs", "jobs-2"], "g", url=f"{redis_url}?protocol={protocol}")
    listener.events = []
    assert listener.listen(max_events=6, idle_timeout=5) == 6
    assert listener.events == [
        *[("jobs", i, {"x": [i]}) for i in range(5)],
        ("jobs-2", 99, None),
    ]
