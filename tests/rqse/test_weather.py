"""Redis weather under a running listener: real conditions on a private server.

Each fault strikes in the middle of a batch (while ``process()`` handles entry 7
of 5..9), lasts a few retries, and passes. The listener must keep every entry,
dead-letter none (``max_deliveries=1``: a single delivery counted for the
weather would be one too many), say once what happened and once that Redis is
back, print no traceback, and go on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from rqse import Backoff, EventClient, EventListener, dead_letter_key, message
from rqse.connection import RedisSettings
from rqse.server import RedisServer, free_port
from rqse.weather import OUT_OF_MEMORY, classify, describe
from tests.conftest import wait_until


@pytest.fixture
def server() -> Iterator[RedisServer]:
    # protected configs: the MISCONF case moves the save directory at run time
    with RedisServer(extra_args=["--enable-protected-configs", "yes"]) as server:
        yield server


class Relay(EventListener):
    """Answers each job on ``out`` (by emit, with the acknowledgement, or by an
    immediate append); ``strike`` runs once, while entry 7 is in hand."""

    def __init__(self, *args: Any, strike: Callable[[], None], mode: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.strike = strike
        self.mode = mode
        self.seen: list[int] = []
        self.struck = threading.Event()

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        n = event["n"]
        if n == 7 and not self.struck.is_set():
            self.struck.set()
            self.strike()
        self.seen.append(n)
        answer = message({"n": n}, kind="answer")
        if self.mode == "emit":
            self.emit(answer, "out")
        else:
            self.append(answer, "out")
        return True


def relay(url: str | None, strike: Callable[[], None], mode: str = "emit", **kw: Any) -> Relay:
    options: dict[str, Any] = {
        "consumer": "w",
        "url": url,
        "batch_size": 5,
        "max_deliveries": 1,
        "claim_idle": 30,
        "reconnect": Backoff(initial=0.02, maximum=0.1),
    }
    options.update(kw)
    return Relay("jobs", "g", strike=strike, mode=mode, **options)


def ride_out(
    server: RedisServer,
    listener: Relay,
    run_listener: Callable[..., Any],
    cure: Callable[[], None],
    caplog: pytest.LogCaptureFixture,
    storm: str,
) -> None:
    """Run ``listener`` over 20 jobs through a fault, cure it, check nothing was lost."""
    caplog.set_level(logging.DEBUG, logger="rqse")
    direct = redis.Redis(port=server.port)
    EventClient("jobs", url=server.url).append_many(
        [message({"n": n}, kind="job") for n in range(20)]
    )
    run = run_listener(listener)
    wait_until(lambda: listener.stats.reconnects >= 3, what="the listener retrying")
    assert listener.running
    cure()
    wait_until(lambda: direct.xlen("out") >= 20, what="every job answered")
    wait_until(lambda: direct.xpending("jobs", "g")["pending"] == 0, what="every job acknowledged")
    run.stop()

    assert set(listener.seen) == set(range(20))
    assert direct.xlen(dead_letter_key("jobs")) == 0, "dead-lettered because of the weather"
    assert listener.stats.dead_lettered == listener.stats.failed == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    spells = [w for w in warnings if storm in w]
    assert len(spells) == 1, f"one line when the spell starts, got {warnings}"
    backs = [r.getMessage() for r in caplog.records if "Redis is back" in r.getMessage()]
    assert len(backs) == 1, backs
    assert not any(r.exc_info for r in caplog.records), "a traceback was logged"
    direct.close()


@pytest.mark.parametrize("mode", ["emit", "append", "emit with the next read"])
def test_a_full_redis_loses_and_dead_letters_nothing_and_the_listener_resumes(
    server, run_listener, caplog, mode
):
    side = redis.Redis(port=server.port)
    listener = relay(server.url, lambda: side.config_set("maxmemory", 1), mode.split()[0])
    listener.flush_with_next_read = mode.endswith("next read")
    ride_out(
        server,
        listener,
        run_listener,
        lambda: side.config_set("maxmemory", 0),
        caplog,
        "Redis is out of memory",
    )


class Bookkeeper(Relay):
    """A Relay whose batches each write first, on ``books`` (as a task worker takes a
    batch's slots, on its kind's home node in a cluster)."""

    def __init__(self, *args: Any, books: redis.Redis, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.books = books

    def prepare_batch(self, stream, entries):
        self.books.incr("batches prepared")
        return None


def test_weather_met_by_the_batch_bookkeeping_costs_no_delivery(server, run_listener, caplog):
    """Weather met by ``prepare_batch()``, on whichever server, gives the batch's
    deliveries back: else each retry through a long storm counts one, and the storm
    dead-letters the batch."""
    with RedisServer() as elsewhere:
        books = redis.Redis(port=elsewhere.port)
        listener = Bookkeeper(
            "jobs",
            "g",
            books=books,
            strike=lambda: books.config_set("maxmemory", 1),
            mode="emit",
            consumer="w",
            url=server.url,
            batch_size=5,
            max_deliveries=1,
            claim_idle=30,
            reconnect=Backoff(initial=0.02, maximum=0.1),
        )
        ride_out(
            server,
            listener,
            run_listener,
            lambda: books.config_set("maxmemory", 0),
            caplog,
            "Redis is out of memory",
        )
        assert int(books.get("batches prepared")) >= 4
        books.close()


def test_entries_of_other_streams_read_with_a_batch_stopped_by_weather_cost_no_delivery(
    server, run_listener
):
    """One read brings entries of two streams; weather stops the first stream's batch.
    The second's entries, delivered by that read and not handled, are given back too."""
    with RedisServer() as elsewhere:
        books = redis.Redis(port=elsewhere.port)
        books.config_set("maxmemory", 1)
        seen: list[str] = []

        class FirstStreamBooked(EventListener):
            def prepare_batch(self, stream, entries):
                if stream == "a":
                    books.incr("batches of a prepared")
                return None

            def process(self, event_id, event):
                seen.append(event["stream"])
                return True

        for stream in ("a", "b"):
            EventClient(stream, url=server.url).append(message({"stream": stream}, kind="job"))
        listener = FirstStreamBooked(
            ["a", "b"],
            "g",
            consumer="w",
            url=server.url,
            max_deliveries=1,
            claim_idle=30,
            reconnect=Backoff(initial=0.02, maximum=0.1),
        )
        run = run_listener(listener)
        wait_until(lambda: listener.stats.reconnects >= 3, what="the listener retrying")
        books.config_set("maxmemory", 0)
        wait_until(lambda: sorted(seen) == ["a", "b"], what="both jobs handled")
        run.stop()
        direct = redis.Redis(port=server.port)
        assert direct.xlen(dead_letter_key("b")) == 0, "dead-lettered because of the weather"
        direct.close()
        books.close()


def test_a_read_only_replica_is_waited_out(server, run_listener, caplog):
    side = redis.Redis(port=server.port)
    # A replica of a master that never answers keeps its data and refuses writes.
    listener = relay(server.url, lambda: side.replicaof("127.0.0.1", free_port()))
    ride_out(
        server,
        listener,
        run_listener,
        lambda: side.replicaof("NO", "ONE"),
        caplog,
        "Redis is a read-only replica",
    )


def test_writes_refused_after_a_failed_save_are_waited_out(server, run_listener, caplog):
    side = redis.Redis(port=server.port)
    home = side.config_get("dir")["dir"]

    def fail_a_save() -> None:
        side.config_set("save", "3600 1")
        side.config_set("dir", "/proc")  # nothing can be created there, not even by root
        side.bgsave()
        wait_until(
            lambda: side.info("persistence")["rdb_last_bgsave_status"] == "err",
            what="the save failing",
        )

    def cure() -> None:
        side.config_set("dir", home)
        side.config_set("stop-writes-on-bgsave-error", "no")

    listener = relay(server.url, fail_a_save)
    ride_out(server, listener, run_listener, cure, caplog, "last save to disk failed")


def test_a_script_keeping_redis_busy_is_waited_out(server, run_listener, caplog):
    side = redis.Redis(port=server.port)
    side.config_set("busy-reply-threshold", 20)
    looping = redis.Redis(port=server.port)
    ended: list[BaseException] = []

    def loop_forever() -> None:
        try:
            looping.eval("while true do end", 0)
        except redis.ResponseError as error:  # killed
            ended.append(error)

    def strike() -> None:
        threading.Thread(target=loop_forever, daemon=True).start()
        time.sleep(0.1)  # past busy-reply-threshold: every other command answers BUSY

    listener = relay(server.url, strike)
    ride_out(
        server, listener, run_listener, side.script_kill, caplog, "Redis is busy running a script"
    )
    assert ended


def test_connections_reset_then_refused_are_waited_out(server, proxy, run_listener, caplog):
    listener = relay(proxy.url, proxy.down)
    ride_out(server, listener, run_listener, proxy.up, caplog, "Redis is unreachable")


def test_a_redis_that_stops_answering_is_waited_out(server, proxy, run_listener, caplog):
    pool = RedisSettings.resolve(url=proxy.url).pool(socket_timeout=0.3, socket_connect_timeout=0.3)
    listener = relay(None, proxy.stall, pool=pool, block_ms=100)
    ride_out(server, listener, run_listener, proxy.resume, caplog, "did not answer in time")


def test_weather_is_described_in_one_line_and_real_errors_are_not_weather(server):
    side = redis.Redis(port=server.port)
    side.config_set("maxmemory", 1)
    with pytest.raises(redis.ResponseError) as full:
        side.xadd("s", {"a": "1"})
    side.config_set("maxmemory", 0)
    side.set("text", "x")
    with pytest.raises(redis.ResponseError) as wrong_type:
        side.xadd("text", {"a": "1"})
    nowhere = RedisSettings.resolve(url=f"redis://127.0.0.1:{free_port()}", env={})
    with pytest.raises(redis.ConnectionError) as refused:
        redis.Redis(connection_pool=nowhere.pool()).ping()

    assert describe(full.value).startswith("Redis is out of memory (")
    assert describe(refused.value).startswith("Redis is unreachable (")
    assert classify(wrong_type.value) is None
    assert describe(wrong_type.value).startswith("ResponseError: WRONGTYPE")
    try:
        try:
            side.config_set("maxmemory", 1)
            side.xadd("s", {"a": "1"})
        finally:
            side.config_set("maxmemory", 0)
    except redis.ResponseError as error:
        wrapped = RuntimeError("the handler's own error")
        wrapped.__cause__ = error
        assert classify(wrapped) is not None, "a handler's error caused by weather is weather"


def test_a_transaction_refused_whole_for_a_full_redis_is_weather(server):
    """Redis 7 refuses EXEC itself when memory ran out after the commands were queued:
    EXECABORT, with the reason after "because of:"."""
    side = redis.Redis(port=server.port)
    connection = redis.Redis(port=server.port).connection_pool.get_connection()
    try:
        for command in (("MULTI",), ("XADD", "s", "*", "a", "1")):
            connection.send_command(*command)
            connection.read_response()
        side.config_set("maxmemory", 1)
        connection.send_command("EXEC")
        with pytest.raises(redis.ResponseError) as refused:
            connection.read_response()
    finally:
        side.config_set("maxmemory", 0)
        connection.disconnect()
    assert "discarded" in str(refused.value)
    assert classify(refused.value) == OUT_OF_MEMORY


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("LOADING Redis is loading the dataset in memory", "Redis is loading its data"),
        ("MASTERDOWN Link with MASTER is down", "Redis is a replica cut off from its master"),
        ("TRYAGAIN Multiple keys request during rehashing of slot", "Redis asks to try again"),
        ("CLUSTERDOWN The cluster is down", "Redis asks to try again"),
        ("NOREPLICAS Not enough good replicas to write.", "Redis asks to try again"),
        ("WRONGPASS invalid username-password pair", "Redis refused the credentials"),
    ],
)
def test_replies_of_states_hard_to_cause_here_are_weather_too(reply, expected):
    """Error replies as redis-py's own parser turns them into exceptions."""
    from redis._parsers.base import BaseParser

    error = BaseParser.parse_error(reply)
    assert describe(error).startswith(expected)


def test_real_errors_are_not_weather():
    from redis._parsers.base import BaseParser

    for reply in ("NOPERM this user has no permissions", "ERR unknown command 'XFOO'"):
        assert classify(BaseParser.parse_error(reply)) is None


def test_a_handler_failing_on_another_redis_is_counted_and_dead_lettered(server, caplog):
    """Weather of a server the handler talks to is the handler's failure: only this
    listener's own Redis refusing writes spares an entry from being counted."""
    elsewhere = RedisSettings.resolve(url=f"redis://127.0.0.1:{free_port()}", env={})
    other = redis.Redis(connection_pool=elsewhere.pool())

    class Copier(EventListener):
        def process(self, event_id, event):
            other.set("copy", event["n"])  # refused: nothing listens there
            return True

    EventClient("jobs", url=server.url).append(message({"n": 1}, kind="job"))
    listener = Copier("jobs", "g", url=server.url, max_deliveries=2, claim_idle=0.05)
    listener.listen(max_events=1)
    [(_, letter)] = EventClient(dead_letter_key("jobs"), url=server.url).range(count=None)
    assert letter["reason"] == "process-error" and "ConnectionError" in letter["error"]
    assert listener.stats.failed == 2 and listener.stats.reconnects == 0


def test_after_a_failover_the_listener_follows_its_address_to_the_new_primary(
    server, proxy, run_listener, caplog
):
    """The old primary turns replica (READONLY) while the address the listener uses
    (the proxy, as a DNS name or a virtual IP would) moves to the promoted replica:
    connections made before the failover must not be reused for ever."""
    caplog.set_level(logging.INFO, logger="rqse")
    old = redis.Redis(port=server.port)
    old.config_set("repl-diskless-sync-delay", 0)  # a full sync at once, not in 5 s
    with RedisServer(extra_args=["--repl-diskless-sync-delay", "0"]) as promoted:
        new = redis.Redis(port=promoted.port)
        new.replicaof("127.0.0.1", server.port)
        EventClient("jobs", url=server.url).append_many(
            [message({"n": n}, kind="job") for n in range(20)]
        )

        def failover() -> None:
            wait_until(
                lambda: (
                    new.info("replication")["master_link_status"] == "up"
                    and new.xlen("jobs") == 20
                    and new.xpending("jobs", "g")["pending"] == 5
                ),
                what="the replica in sync",
            )
            new.replicaof("NO", "ONE")
            proxy.target = ("127.0.0.1", promoted.port)
            old.replicaof("127.0.0.1", promoted.port)

        listener = relay(None, failover, pool=RedisSettings.resolve(url=proxy.url).pool())
        run = run_listener(listener)
        wait_until(lambda: new.xlen("out") >= 20, what="every job answered by the new primary")
        wait_until(lambda: new.xpending("jobs", "g")["pending"] == 0, what="all acknowledged")
        run.stop()
        assert set(listener.seen) == set(range(20))
        assert new.xlen(dead_letter_key("jobs")) == 0
        assert "Redis is a read-only replica" in caplog.text
        assert "Redis is back" in caplog.text


def test_a_redis_just_below_its_limit_refusing_a_large_write_is_weather_not_a_failure(
    server, run_listener, caplog
):
    """Out of memory is a level: the handler's megabyte is refused while the small
    probe that tells this Redis's weather still passes. Near the limit it is weather."""
    side = redis.Redis(port=server.port)
    big = "x" * (1 << 20)

    class BigRelay(Relay):
        def process(self, event_id: str, event: dict[str, Any]) -> bool:
            if event["n"] == 7 and not self.struck.is_set():
                self.struck.set()
                used = side.info("memory")["used_memory"]
                side.config_set("maxmemory", used + (256 << 10))
            self.seen.append(event["n"])
            self.append(message({"n": event["n"], "blob": big}, kind="answer"), "out")
            return True

    listener = BigRelay(
        "jobs", "g", strike=lambda: None, mode="append", consumer="w", url=server.url,
        batch_size=5, max_deliveries=1, claim_idle=30,
        reconnect=Backoff(initial=0.02, maximum=0.1),
    )  # fmt: skip
    try:
        ride_out(
            server,
            listener,
            run_listener,
            lambda: side.config_set("maxmemory", 0),
            caplog,
            "Redis is out of memory",
        )
    finally:
        side.config_set("maxmemory", 0)
