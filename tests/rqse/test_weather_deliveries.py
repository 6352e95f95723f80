"""Redis weather costs no entry a delivery, on every path an entry is delivered by.

Each test makes one real condition strike (a script keeping the server busy, a
stalled network, a failover leaving the server a read-only replica, a full
server) at one precise point of the listener's work: after a claim, before the
delivery counts are read, between a read and the replies that go with it, in
``finish_batch()``. Then it cures the weather and checks that the entry is
processed as if nothing had happened: nothing is dead-lettered for
``max_deliveries``, which is set so that a single delivery counted for the
weather is one too many. ``classify`` is checked directly for the pipeline
errors it used to miss.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from rqse import Backoff, EventClient, EventListener, dead_letter_key, message
from rqse.connection import RedisSettings
from rqse.server import RedisServer, free_port
from rqse.weather import BUSY, MISCONF, TIMEOUT, classify
from tests.conftest import wait_until
from tests.rqse.helpers import Running, busy_server

STREAM = "jobs"
GROUP = "g"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    # Private: the tests reconfigure it (busy-reply-threshold, maxmemory, REPLICAOF).
    with RedisServer() as server:
        yield server


@pytest.fixture
def direct(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis(port=server.port)
    yield client
    client.close()


class Worker(EventListener):
    """Records the jobs it processed."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("consumer", "w")
        kw.setdefault("reconnect", Backoff(initial=0.02, maximum=0.1))
        super().__init__(STREAM, GROUP, *args, **kw)
        self.seen: list[int] = []

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        self.seen.append(event["n"])
        return True


def add_jobs(server: RedisServer, count: int = 1) -> None:
    EventClient(STREAM, url=server.url).append_many(
        [message({"n": n}, kind="job") for n in range(count)]
    )


def held_by_a_crashed_consumer(server: RedisServer, direct: redis.Redis) -> None:
    """One job, delivered once to a consumer that is gone: the listener claims it."""
    direct.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    add_jobs(server)
    direct.xreadgroup(GROUP, "ghost", {STREAM: ">"}, count=1)


def settle(run: Running, direct: redis.Redis, jobs: int = 1) -> None:
    """Wait until every job was handled (processed or dead-lettered, acknowledged
    either way), then stop the listener; its own error, if it ended with one, is
    raised here."""
    listener = run.listener

    def settled() -> bool:
        return listener.stats.handled >= jobs and direct.xpending(STREAM, GROUP)["pending"] == 0

    wait_until(lambda: settled() or not run.thread.is_alive(), what="every job handled", timeout=15)
    run.stop()


def assert_nothing_dead_lettered(direct: redis.Redis) -> None:
    letters = direct.xrange(dead_letter_key(STREAM))
    assert not letters, f"dead-lettered because of the weather: {letters}"


def test_classify_reads_the_reply_a_pipeline_error_carries(server):
    """redis-py words an error met in a pipeline "Command # 1 (...) of pipeline caused
    error: <the reply>", and for BUSY and MISCONF (no class of their own) sets no
    status code: only the reply's own words tell the weather."""
    side = redis.Redis(port=server.port)
    with busy_server(server):
        pipe = side.pipeline(transaction=False)
        pipe.xpending_range(STREAM, GROUP, "-", "+", 1)
        with pytest.raises(redis.ResponseError) as busy:
            pipe.execute()
    assert " of pipeline caused error: BUSY" in str(busy.value)
    assert classify(busy.value) == BUSY

    # A failed save is slow to cause on cue: redis-py's own parser and pipeline
    # wording build the error exactly as a pipeline would raise it.
    from redis._parsers.base import BaseParser

    misconf = BaseParser.parse_error(
        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable "
        "to persist to disk."
    )
    side.pipeline().annotate_exception(misconf, 1, ("XADD", STREAM, "*", "a", "1"))
    assert str(misconf).startswith("Command # 1 (XADD jobs * a 1) of pipeline caused error: ")
    assert classify(misconf) == MISCONF

    # A real error stays one through a pipeline.
    side.set("text", "x")
    pipe = side.pipeline(transaction=False)
    pipe.xadd("text", {"a": "1"})
    with pytest.raises(redis.ResponseError) as wrong_type:
        pipe.execute()
    assert " of pipeline caused error: WRONGTYPE" in str(wrong_type.value)
    assert classify(wrong_type.value) is None
    side.close()


def test_a_busy_server_met_through_a_pipeline_is_weather(server, direct, run_listener):
    """BUSY strikes the pipeline reading the delivery counts of an entry just claimed:
    waited out as weather, not the end of listen() (a RedisCommandError), and the
    claim's delivery is not counted (delivery 3 in Redis is 2 for max_deliveries)."""
    held_by_a_crashed_consumer(server, direct)
    met: list[BaseException] = []

    class Busied(Worker):
        def _delivery_counts(self, stream, entries):
            if met:
                return super()._delivery_counts(stream, entries)
            with busy_server(server):
                try:
                    return super()._delivery_counts(stream, entries)
                except redis.RedisError as error:
                    met.append(error)
                    raise

    listener = Busied(url=server.url, max_deliveries=2, claim_idle=0.2)
    run = run_listener(listener)
    settle(run, direct)

    assert met and classify(met[0]) == BUSY, met
    assert " of pipeline caused error: BUSY" in str(met[0])
    assert listener.stats.claimed >= 1 and listener.stats.reconnects >= 1
    assert_nothing_dead_lettered(direct)
    assert listener.seen == [0]


def test_counts_unread_after_a_claim_cost_no_delivery(server, proxy, direct, run_listener):
    """The network stalls (longer than socket_timeout) right after XAUTOCLAIM, then
    again right after the history read that recovers the entry, each time before
    XPENDING reads the count those reads just raised: neither delivery is the entry's
    (4 in Redis, 2 for max_deliveries=2)."""
    held_by_a_crashed_consumer(server, direct)
    met: list[BaseException] = []

    class Stalled(Worker):
        def _delivery_counts(self, stream, entries):
            if len(met) >= 2:
                return super()._delivery_counts(stream, entries)
            proxy.stall()
            try:
                return super()._delivery_counts(stream, entries)
            except redis.RedisError as error:
                met.append(error)
                raise
            finally:
                proxy.resume()

    pool = RedisSettings.resolve(url=proxy.url).pool(socket_timeout=0.3, socket_connect_timeout=0.3)
    listener = Stalled(pool=pool, block_ms=100, max_deliveries=2, claim_idle=0.2)
    run = run_listener(listener)
    settle(run, direct)

    assert [classify(error) for error in met] == [TIMEOUT, TIMEOUT], met
    assert listener.stats.claimed >= 1 and listener.stats.recovered >= 2
    assert_nothing_dead_lettered(direct)
    assert listener.seen == [0]


def test_a_delivery_noted_for_a_read_only_storm_survives_an_out_of_memory_one(
    server, direct, run_listener
):
    """A failover leaves the server a read-only replica while the entry is in hand:
    even giving its delivery back (XCLAIM) is refused, so it is noted here. Once
    writes pass again the entry comes back and meets a full server: that give-back
    is accepted, and must take the note into account, or it sets Redis's count one
    too high and the next delivery dead-letters the entry (max_deliveries=1)."""
    direct.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    add_jobs(server)
    full = threading.Event()
    reconnects_when_full: list[int] = []

    class Struck(Worker):
        calls = 0

        def process(self, event_id, event):
            Struck.calls += 1
            if Struck.calls == 1:  # a replica of a primary that never answers
                direct.replicaof("127.0.0.1", free_port())
                self.connection.set("work", "1")  # READONLY
            elif Struck.calls == 2:
                direct.config_set("maxmemory", 1)
                reconnects_when_full.append(self.stats.reconnects)
                full.set()
                self.connection.set("work", "2")  # OOM
            return super().process(event_id, event)

    listener = Struck(url=server.url, max_deliveries=1, claim_idle=30)
    run = run_listener(listener)
    try:
        wait_until(lambda: listener.stats.reconnects >= 1, what="the read-only storm met")
        direct.replicaof("NO", "ONE")
        wait_until(full.is_set, what="the entry back, and the server full")
        # The storm reached the loop: the give-back it made is done.
        wait_until(
            lambda: listener.stats.reconnects > reconnects_when_full[0],
            what="the out-of-memory storm met",
        )
    finally:
        direct.replicaof("NO", "ONE")
        direct.config_set("maxmemory", 0)
    settle(run, direct)

    assert_nothing_dead_lettered(direct)
    assert Struck.calls == 3
    assert not listener._weathered, "a note outlived the entry's acknowledgement"
    assert listener.seen == [0]


def test_a_read_reply_held_back_by_a_busy_server_costs_no_delivery(server, direct, run_listener):
    """The read delivered the entry in Redis, but its reply never reached the listener:
    a script sent right behind it (``read_along``) keeps the server busy past
    socket_timeout, and Redis writes the read's reply only after the script. The next
    recovery notes that delivery as the weather's: recovering the entry counts 1, not
    2 (max_deliveries=1)."""
    direct.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    direct.config_set("busy-reply-threshold", 50)  # SCRIPT KILL is heard after that
    add_jobs(server)

    class HeldBack(Worker):
        reads = 0

        @property
        def read_along(self) -> tuple[tuple[Any, ...], ...]:
            HeldBack.reads += 1  # the first read only: the others go through
            return (("EVAL", "while true do end", 0),) if HeldBack.reads == 1 else ()

    pool = RedisSettings.resolve(url=server.url).pool(socket_timeout=0.3)
    listener = HeldBack(pool=pool, block_ms=100, max_deliveries=1, claim_idle=30)
    run = run_listener(listener)
    try:
        # The script ends once the read timed out, not on a clock: Redis's TIME
        # stands still inside a script until busy-reply-threshold.
        wait_until(lambda: listener.stats.reconnects >= 1, what="the read timing out")
    finally:
        killed = False
        while not killed:
            try:
                killed = direct.script_kill()
            except redis.ResponseError as error:  # NOTBUSY: the read never got there
                killed = str(error).startswith("NOTBUSY")
    settle(run, direct)

    assert listener.stats.recovered >= 1
    assert_nothing_dead_lettered(direct)
    assert listener.seen == [0]


def test_entries_of_a_read_whose_along_reply_timed_out_are_given_back(server, direct, run_listener):
    """The read's reply arrived, but a reply that goes with it (``read_along``) did not
    come within socket_timeout: the connection is dropped with the entries unhandled,
    and their delivery is given back."""
    direct.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    add_jobs(server)

    class CutShort(Worker):
        reads = 0

        @property
        def read_along(self) -> tuple[tuple[Any, ...], ...]:
            # Once: a reply that takes a second (an empty list waited on) behind the read.
            CutShort.reads += 1
            return (("BLPOP", "never", 1),) if CutShort.reads == 1 else ()

    pool = RedisSettings.resolve(url=server.url).pool(socket_timeout=0.3)
    listener = CutShort(pool=pool, block_ms=100, max_deliveries=1, claim_idle=30)
    run = run_listener(listener)
    settle(run, direct)

    assert listener.stats.reconnects >= 1 and listener.stats.recovered >= 1
    assert_nothing_dead_lettered(direct)
    assert listener.seen == [0]


def test_weather_in_finish_batch_writes_nothing_and_costs_no_delivery(server, direct, run_listener):
    """``finish_batch()`` keeps its books on a full server (as a task worker releases
    a batch's slots on its kind's node): each try of the batch meets the weather
    there, writes nothing of the batch (answers, acknowledgements, what the hook
    emitted) and is counted as no delivery (max_deliveries=1)."""
    with RedisServer() as elsewhere:
        books = redis.Redis(port=elsewhere.port)
        books.config_set("maxmemory", 1)

        class Answering(Worker):
            def process(self, event_id, event):
                self.emit(message({"n": event["n"]}, kind="answer"), "out")
                return super().process(event_id, event)

            def finish_batch(self, stream):
                self.emit(message({}, kind="batch finished"), "finished")
                books.incr("batches finished")

        direct.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        add_jobs(server, 3)
        listener = Answering(url=server.url, max_deliveries=1, claim_idle=30)
        run = run_listener(listener)
        try:
            wait_until(lambda: listener.stats.reconnects >= 3, what="the listener retrying")
            assert direct.xpending(STREAM, GROUP)["pending"] == 3
            assert direct.xlen("out") == direct.xlen("finished") == 0
        finally:
            books.config_set("maxmemory", 0)
        settle(run, direct, jobs=3)

        assert_nothing_dead_lettered(direct)
        assert sorted(set(listener.seen)) == [0, 1, 2]
        assert direct.xlen("out") == 3, "a batch's answers written more than once"
        assert int(books.get("batches finished")) >= 1
        books.close()


def test_a_batch_whose_transaction_went_out_with_a_read_lost_in_a_stall_costs_no_delivery(
    server, proxy, direct, run_listener
):
    """With ``flush_with_next_read``, a batch's acknowledgement goes in the round trip
    of the next read. The network stalls and drops that round trip, so whether the
    transaction ran is unknown: the batch's delivery is given back (or noted) all the
    same, since it was delivered before the lost read was sent."""
    direct.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    add_jobs(server)

    class Deferring(Worker):
        cut = False

        def process(self, event_id: str, event: dict[str, Any]) -> bool:
            time.sleep(0.05)  # delivered well before the next round trip is sent
            return super().process(event_id, event)

        def _flush_and_read(self, block_ms: int | None) -> None:
            if Deferring.cut:
                return super()._flush_and_read(block_ms)
            Deferring.cut = True
            proxy.stall()  # nothing reaches Redis: the transaction does not run
            try:
                return super()._flush_and_read(block_ms)
            finally:
                proxy.drop()
                proxy.resume()

    pool = RedisSettings.resolve(url=proxy.url).pool(socket_timeout=0.3, socket_connect_timeout=0.3)
    listener = Deferring(pool=pool, block_ms=100, max_deliveries=1, claim_idle=30)
    listener.flush_with_next_read = True
    run = run_listener(listener)
    settle(run, direct)

    assert Deferring.cut
    assert_nothing_dead_lettered(direct)
    assert listener.seen == [0, 0]  # processed again: its acknowledgement never ran


def test_an_entry_that_fails_on_its_own_is_still_dead_lettered_after_max_deliveries(
    server, direct, run_listener
):
    """What weather gives back is the weather's delivery only: an entry whose handler
    fails by itself, with a spell of out-of-memory on its first delivery, is
    dead-lettered on its third counted failure (max_deliveries=3), not sooner, not
    later."""
    direct.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    add_jobs(server)

    class Failing(Worker):
        calls = 0

        def process(self, event_id: str, event: dict[str, Any]) -> bool:
            Failing.calls += 1
            if Failing.calls == 1:
                direct.config_set("maxmemory", 1)
                threading.Timer(0.2, lambda: direct.config_set("maxmemory", 0)).start()
                self.connection.set("work", "1")  # refused: the weather's delivery
            raise ValueError("the entry's own fault")

    listener = Failing(url=server.url, max_deliveries=3, claim_idle=0.05)
    run = run_listener(listener)
    wait_until(lambda: direct.xlen(dead_letter_key(STREAM)), what="the dead letter", timeout=15)
    run.stop()

    [(_, letter)] = direct.xrange(dead_letter_key(STREAM))
    assert letter[b"reason"] == b'"process-error"'
    assert letter[b"deliveries"] == b"3"
    assert Failing.calls == 4  # one cut by the weather, three failures counted


def test_a_stop_gives_back_the_interrupted_entry_and_those_not_started(
    server, direct, run_listener
):
    """A stop in the middle of a batch costs none of its entries a delivery: the one
    it interrupted and the two after it are taken by the next listener as first
    deliveries (max_deliveries=1)."""
    direct.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    add_jobs(server, 3)

    class Stopped(Worker):
        def process(self, event_id: str, event: dict[str, Any]) -> bool:
            self.stop()
            raise InterruptedError("stopping")

    first = Stopped(url=server.url, batch_size=3, max_deliveries=1, handle_signals=False)
    first.listen()
    counts = [p["times_delivered"] for p in direct.xpending_range(STREAM, GROUP, "-", "+", 3)]
    assert counts == [0, 0, 0]

    after = Worker(url=server.url, consumer="w2", max_deliveries=1, claim_idle=0.05)
    settle(run_listener(after), direct, jobs=3)
    assert_nothing_dead_lettered(direct)
    assert sorted(after.seen) == [0, 1, 2]


def test_a_lost_read_behind_many_pending_entries_is_found_on_the_last_page(server, direct):
    """The recovery that looks for what a lost read delivered goes by idle times over
    pages of the consumer's pending entries: the newest, on the last page, are found
    however long the paging took, and the old ones are left as counted."""
    direct.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    pipe = direct.pipeline(transaction=False)
    for n in range(2_510):
        pipe.xadd(STREAM, {"n": n})
    pipe.execute()
    direct.xreadgroup(GROUP, "w", {STREAM: ">"}, count=2_500)  # held since long ago
    time.sleep(0.05)
    listener = Worker(url=server.url, handle_signals=False)
    listener._lost_delivery = time.monotonic()  # a read is sent, its reply lost...
    direct.xreadgroup(GROUP, "w", {STREAM: ">"}, count=10)  # ...and it delivered 10
    listener._give_back_lost_deliveries()

    pending = direct.xpending_range(STREAM, GROUP, "-", "+", 3_000)
    assert [p["times_delivered"] for p in pending[:2_500]] == [1] * 2_500
    assert [p["times_delivered"] for p in pending[2_500:]] == [0] * 10
    assert listener._lost_delivery is None


def test_a_stop_during_a_read_only_spell_notes_each_entry_once(server, direct):
    """The stop's give-back comes after the batch's writes: when Redis refuses those
    (a replica), the batch is given back once, by the weather's give-back, and each
    entry is noted once, not once for the stop and once more for the weather."""
    direct.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    add_jobs(server, 2)
    direct.xreadgroup(GROUP, "w", {STREAM: ">"}, count=2)  # a delivery counted each
    [(_, entries)] = direct.xreadgroup(GROUP, "w", {STREAM: "0"}, count=2)  # and a second

    class StoppedMidway(Worker):
        def process(self, event_id: str, event: dict[str, Any]) -> bool:
            self._stopping.set()  # a stop arrives while the first entry runs
            return super().process(event_id, event)

    listener = StoppedMidway(url=server.url, handle_signals=False)
    counts = {
        p["message_id"]: p["times_delivered"]
        for p in direct.xpending_range(STREAM, GROUP, "-", "+", 10)
    }
    assert list(counts.values()) == [2, 2]
    direct.replicaof("127.0.0.1", free_port())
    try:
        with pytest.raises(redis.ReadOnlyError):
            listener._handle(STREAM, entries, counts)
    finally:
        direct.replicaof("NO", "ONE")
    assert listener._weathered == {(STREAM, entry_id): 1 for entry_id, _ in entries}
