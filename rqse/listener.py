"""EventListener: consume streams through a consumer group, at least once.

One loop, one thread (``listen()``):

1. establish: create the group on every stream (MKSTREAM; BUSYGROUP from a
   concurrent creator is fine), call ``onEstablished()``, then re-process this
   consumer's own pending entries (XREADGROUP from id 0);
2. every ``claim_idle / 2`` seconds, take over entries idle longer than
   ``claim_idle`` from any consumer, this one included (XAUTOCLAIM) - that is
   how crashed consumers' work is recovered and how failed entries are retried;
3. read new entries (XREADGROUP ``>`` COUNT ``batch_size`` BLOCK ``block_ms``);
   the read returns as soon as an entry arrives, so an idle listener costs one
   command per ``block_ms`` and wakes at once;
4. per batch, ``prepare_batch()`` on the raw entries (ids it returns are
   acknowledged unseen); per entry: decode (malformed -> dead letter), skip kinds
   not in ``select`` (or dead-letter them: ``dead_letter_unselected``), call
   ``process()``; then acknowledge the batch, with
   whatever ``emit()`` queued, in one transaction (:mod:`rqse.outbox`).

``process()`` returning truthy acknowledges (processed), falsy acknowledges as
declined ("not mine"), raising leaves the entry pending: it is retried after
``claim_idle`` and moved to the dead-letter stream once it has been delivered
``max_deliveries`` times.

Redis weather (:mod:`rqse.weather`: unreachable, out of memory, read-only,
loading, MISCONF, busy) never ends the loop: it backs off (capped, jittered),
logs one line when a spell starts or changes and one when Redis is back, and
re-establishes. No entry is lost, since nothing is acknowledged before it was
handled, and none is dead-lettered for it (see :mod:`rqse.batch`).

Streams that appear later: :meth:`EventListener.add_streams`, or a ``discover``
callable the loop itself calls every ``discover_every`` seconds (no other thread
reads). A new stream gets the group at id 0 (MKSTREAM), so entries already in it
are served, and joins the next read; when ``discover`` names nothing new, the
cost is that call alone.

Stopping: ``stop()`` or a first SIGINT/SIGTERM ends the loop after the entry in
hand; a blocking read is cut short (CLIENT UNBLOCK, or by closing its socket
when Redis does not answer). A signal also arms ``drain_timeout``: past it the
process exits as on a second signal, whatever the listener is doing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from time import monotonic
from typing import Any, cast

import redis

from rqse.backoff import Backoff
from rqse.batch import Entry, ListenerStats
from rqse.client import EventClient, _xadd_options
from rqse.connection import translate_errors
from rqse.durability import server_warnings
from rqse.errors import ConfigurationError, RedisCommandError
from rqse.events import KIND, encode_event, raw_stream_items
from rqse.fastpipe import Template, execute, pack, read, send, transaction_replies
from rqse.lease import Lease
from rqse.outbox import Outbox
from rqse.recovery import Recovery
from rqse.shutdown import SignalHandlers
from rqse.weather import READONLY, Forecast, classify, is_weather

__all__ = ["EventListener", "ListenerStats", "default_consumer_name"]

logger = logging.getLogger(__name__)

# Options of rqse 0.5's polling loop; accepted so old subclasses still construct.
_LEGACY_OPTIONS = frozenset({"wait", "pause", "block", "idle_count", "backoff"})

# Errors meaning the stream or the group is gone (deleted; Redis 7 answers a
# blocked read on a deleted stream with UNBLOCKED, Valkey with NOGROUP).
_GONE = ("NOGROUP", "UNBLOCKED")


def default_consumer_name() -> str:
    """``<hostname>-<pid>-<random>``: unique per process, so never shared by accident."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class EventListener(Recovery, EventClient):
    """Listen to ``key`` (a stream, or several) as consumer ``consumer`` of ``group``.

    Subclasses override :meth:`process` and optionally the ``onStart``,
    ``onEstablished`` and ``onStop`` hooks. Options (keyword only):

    ``select``           kinds to process (all when empty); others are acknowledged unseen,
                         or dead-lettered with ``dead_letter_unselected``
    ``consumer``         stable name: a restarted consumer first re-processes what it held
    ``batch_size``       entries per read and per acknowledging transaction
    ``block_ms``         longest wait of one read (stop() and signals cut it short)
    ``max_deliveries``   deliveries before a failing entry is dead-lettered
    ``claim_idle``       seconds before another consumer takes an unacknowledged entry
    ``max_entry_bytes``  larger entries are dead-lettered as ``oversize``
    ``reconnect``        :class:`rqse.backoff.Backoff` between retries while Redis is away
    ``handle_signals``   install SIGINT/SIGTERM handlers when listening in the main thread
    ``drain_timeout``    seconds a signalled listener may take to finish; then it exits
    ``discover``         callable returning every stream to follow (those already
                         followed included): streams it names that are new are added as
                         by :meth:`add_streams`. Called from the loop when establishing and
                         every ``discover_every`` seconds; a non-Redis exception it raises
                         is logged and the call tried again next time. Streams are never
                         dropped.
    ``discover_every``   seconds between two ``discover`` calls
    ``order``            sort key of the streams (a callable taking a stream name): one
                         read names them in this order and its entries are handled
                         stream by stream in it, so a stream that sorts first is served
                         first within every batch (each stream still brings up to
                         ``batch_size`` per read: none waits more than one batch);
                         streams joined later take their place. Default: as given.
    ``own_garbage``      dead-letter entries that cannot be decoded (the default); a
                         reader that shares a stream another group owns passes False:
                         it acknowledges them unseen, and the owner's dead letter is the
                         only one
    ``dead_letter_unselected``  dead-letter (reason ``unselected``) entries of a kind not
                         in ``select`` instead of acknowledging them unseen: for streams
                         only those kinds belong on, so that an entry of a kind this
                         listener does not know (garbage, or a newer writer's) is kept,
                         to be requeued once a listener that knows it runs. Receipts
                         (rqse's own, written to the stream of what they are for) are
                         still acknowledged unseen; only with ``own_garbage``
    """

    def __init__(
        self,
        key: str | Sequence[str],
        group: str,
        select: Iterable[str] | None = None,
        consumer: str | None = None,
        *,
        url: str | None = None,
        host: str | None = None,
        port: int | str | None = None,
        username: str | None = None,
        password: str | None = None,
        pool: redis.ConnectionPool | None = None,
        select_attribute: str = KIND,
        batch_size: int = 100,
        block_ms: int = 1000,
        max_deliveries: int = 5,
        claim_idle: float = 60.0,
        max_entry_bytes: int = 8 * 1024 * 1024,
        reconnect: Backoff | None = None,
        handle_signals: bool = True,
        drain_timeout: float = 10.0,
        discover: Callable[[], Iterable[str]] | None = None,
        discover_every: float = 5.0,
        own_garbage: bool = True,
        dead_letter_unselected: bool = False,
        order: Callable[[str], Any] | None = None,
        **legacy: Any,
    ) -> None:
        streams = (key,) if isinstance(key, str) else tuple(key)
        if not streams or not all(isinstance(s, str) and s for s in streams):
            raise ValueError(f"key must be a stream name or a list of them, got {key!r}")
        super().__init__(streams[0], url, host, port, username, password, pool)
        if not group or not isinstance(group, str):
            raise ValueError(f"group must be a non-empty string, got {group!r}")
        unknown = set(legacy) - _LEGACY_OPTIONS
        if unknown:
            raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(unknown))}")
        if legacy:
            warnings.warn(
                f"rqse 0.5 polling options {sorted(legacy)} are ignored "
                "(the listener blocks on the stream instead)",
                DeprecationWarning,
                stacklevel=2,
            )
        self._check_options(batch_size, block_ms, max_deliveries, claim_idle, max_entry_bytes)
        if not drain_timeout > 0:
            raise ConfigurationError(f"drain_timeout must be positive, got {drain_timeout!r}")
        if not discover_every > 0:
            raise ConfigurationError(f"discover_every must be positive, got {discover_every!r}")
        if discover is not None and not callable(discover):
            raise ConfigurationError(f"discover must be callable, got {discover!r}")
        if order is not None and not callable(order):
            raise ConfigurationError(f"order must be callable, got {order!r}")
        self._order = order
        if order is not None:
            streams = tuple(sorted(dict.fromkeys(streams), key=order))
        self._streams = streams
        self._group = group
        self._consumer = consumer or default_consumer_name()
        self._select = frozenset(select) if select else None
        self._select_attribute = select_attribute
        self._batch_size = batch_size
        self._block_ms = block_ms
        self._max_deliveries = max_deliveries
        self._claim_idle = claim_idle
        self._max_entry_bytes = max_entry_bytes
        self._reconnect = reconnect or Backoff()
        self._handle_signals = handle_signals
        self._drain_timeout = drain_timeout
        self._own_garbage = own_garbage
        self._unselected_to_dead_letters = dead_letter_unselected and own_garbage
        self._drain_timer: threading.Timer | None = None
        self._forecast = Forecast(f"consumer {self._consumer}", logger)
        self._weathered: dict[tuple[str, bytes], int] = {}
        self._lost_delivery: float | None = None
        self._not_lost: set[tuple[str, bytes]] = set()
        self._batch_noted = False
        self._interrupted: list[Entry] = []
        self._failed_lately: list[tuple[str, bytes]] = []
        self._checked_server = False
        self.stats = ListenerStats()
        self._outbox = Outbox()
        self._lease = Lease(self._redis, group, self._consumer, interval=claim_idle / 3)
        self._stopping = threading.Event()
        self._signals = SignalHandlers(self._on_signal)
        self._reader: redis.Redis | None = None
        self._reader_id: int | None = None
        self._blocking = False
        self._running = False
        self._established = False
        self._in_batch = False
        self._current_stream: str | None = None
        self._next_claim = 0.0
        self._limit: int | None = None  # stats.handled at which listen() returns
        self._claim_cursors = {stream: "0-0" for stream in streams}
        self._new_offsets: dict[Any, Any] = {stream: ">" for stream in streams}
        self._names = {stream.encode(): stream for stream in streams}
        self._discover = discover
        self._discover_every = discover_every
        self._next_discover = 0.0
        # Streams handed to add_streams() from any thread, joined by the loop's own
        # thread between two reads (the reads' arguments are that thread's alone).
        self._added: list[str] = []
        self._added_lock = threading.Lock()

    def _check_options(
        self,
        batch_size: int,
        block_ms: int,
        max_deliveries: int,
        claim_idle: float,
        max_entry_bytes: int,
    ) -> None:
        for name, value in (
            ("batch_size", batch_size),
            ("block_ms", block_ms),
            ("max_deliveries", max_deliveries),
            ("claim_idle", claim_idle),
            ("max_entry_bytes", max_entry_bytes),
        ):
            if not value > 0:
                raise ConfigurationError(f"{name} must be positive, got {value!r}")
        timeout = self._pool.connection_kwargs.get("socket_timeout")
        if timeout is not None and block_ms >= timeout * 1000:
            raise ConfigurationError(
                f"block_ms={block_ms} must be below the pool's socket_timeout ({timeout}s), "
                "or every idle read would time out"
            )

    # -- what subclasses see -------------------------------------------------------
    @property
    def group(self) -> str:
        return self._group

    @property
    def consumer(self) -> str:
        return self._consumer

    @property
    def streams(self) -> tuple[str, ...]:
        return self._streams

    @property
    def current_stream(self) -> str | None:
        """The stream of the entry being processed (None outside ``process``)."""
        return self._current_stream

    @property
    def running(self) -> bool:
        return self._running

    @property
    def stopping(self) -> bool:
        """True once stop() was called or a signal asked the listener to stop."""
        return self._stopping.is_set()

    @property
    def established(self) -> bool:
        return self._established

    @property
    def listening(self) -> bool:
        """False once a stop was requested."""
        return not self._stopping.is_set()

    #: Commands sent in the same round trip as each read of new entries, right after
    #: it: Redis runs them as the read returns, so their replies (``read_replies``, in
    #: order, an error reply as its exception) say how things stood when the entries
    #: came, for ``prepare_batch`` to use at no round trip of its own.
    read_along: Sequence[Sequence[Any]] = ()
    #: The replies to ``read_along`` while the entries of a read are handled; None for
    #: entries claimed or recovered (nothing was sent along) and outside a batch.
    read_replies: list[Any] | None = None
    #: Send the writes of a batch of new entries (its acknowledgements, what it emitted)
    #: in the round trip of the next read rather than in one of their own: one round
    #: trip per batch instead of two, which is most of what a batch of one costs. The
    #: writes stay one transaction and run at once (the read, behind them, may block);
    #: when the listener does something else first (a claim scan, discovering streams,
    #: returning), they go alone before it.
    flush_with_next_read: bool = False

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        """Handle one event: True = handled, False = not mine; raise to retry later."""
        return True

    def onStart(self) -> None:  # noqa: N802 - names kept from rqse 0.5
        """Called when ``listen()`` starts, before connecting."""

    def onEstablished(self) -> None:  # noqa: N802
        """Called each time the groups exist and the loop is about to read (also after a
        reconnect)."""

    def onStop(self) -> None:  # noqa: N802
        """Called when ``listen()`` ends (not after a forced exit on a second signal)."""

    def emit(
        self,
        event: Mapping[str, Any],
        key: str | None = None,
        *,
        maxlen: int | None = None,
        minid: str | None = None,
        approximate: bool = True,
    ) -> None:
        """Append ``event`` to ``key`` (default: this listener's stream) together with
        the acknowledgement of the current batch, in one transaction.

        Either both happen or neither: if the listener dies first, the entry is
        processed again and emits again. Outside ``process`` it is written at once.
        Use :meth:`append` instead when the id is needed or the event must be
        visible before ``process`` returns (e.g. a receipt before a long task).
        """
        self.emit_fields(
            encode_event(event), key, maxlen=maxlen, minid=minid, approximate=approximate
        )

    def emit_fields(
        self,
        fields: Mapping[str | bytes, bytes],
        key: str | None = None,
        *,
        maxlen: int | None = None,
        minid: str | None = None,
        approximate: bool = True,
    ) -> None:
        """:meth:`emit` for an event already in the wire format: field name (str, or
        UTF-8 bytes) -> JSON value as bytes (for pass-through consumers that never
        decode what they copy)."""
        stream = key or self.key
        options = _xadd_options(maxlen, minid, approximate)
        if not self._in_batch:
            with translate_errors("XADD", f"{stream!r} at {self.location}"):
                self._redis.xadd(stream, cast(Any, fields), **options)
            return
        self._outbox.add(stream, cast(Any, fields), options)

    def emit_filled(self, xadd: Template, *values: bytes) -> None:
        """:meth:`emit` of an ``XADD <stream> * <fields>`` :class:`rqse.fastpipe.Template`
        filled with ``values``: for consumers whose answers differ from one another in
        a few fields only (packing a filled template costs half of packing each field)."""
        command = xadd.fill(*values)
        if not self._in_batch:
            with translate_errors("XADD", f"{xadd.arguments[1]!r} at {self.location}"):
                (reply,) = execute(self._redis, [command])
                if isinstance(reply, BaseException):
                    raise reply
            return
        self._outbox.adds.append(command)  # add_packed(), less a call per answer

    def emit_command(self, *arguments: bytes | str | int | float) -> None:
        """Send a command of any kind in the transaction of the batch in hand, after what
        it emitted (outside ``process`` and ``finish_batch``: at once). Its reply is not
        seen: for writes that go with the batch, such as releasing what it held."""
        if not self._in_batch:
            with translate_errors(str(arguments[0]), f"at {self.location}"):
                (reply,) = execute(self._redis, [arguments])
                if isinstance(reply, BaseException):
                    raise reply
            return
        self._outbox.add_packed(pack(arguments))

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` or until a stop is requested; True if stopping."""
        return self._stopping.wait(seconds)

    def stop(self) -> None:
        """Ask ``listen()`` to return after the event in hand; thread-safe, idempotent.

        Returns at once: a blocking read is cut short from other threads.
        """
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._start_waking()

    def add_streams(self, streams: str | Iterable[str]) -> None:
        """Follow ``streams`` too (those already followed are left as they are).

        Thread-safe and cheap: the names are queued, and the loop joins them before
        its next read (a read already blocking finishes first, within ``block_ms``):
        it creates the group at id 0 (MKSTREAM), so what the streams already hold is
        served, and re-processes this consumer's own pending entries of them.
        Before ``listen()``, the streams simply join the others.
        """
        names = (streams,) if isinstance(streams, str) else tuple(streams)
        for name in names:
            if not isinstance(name, str) or not name:
                raise ValueError(f"a stream name must be a non-empty string, got {name!r}")
        with self._added_lock:
            self._added.extend(names)

    def _join_added(self) -> list[str]:
        """Take the queued streams in (loop thread only); return those that are new."""
        with self._added_lock:
            added, self._added = self._added, []
        new = [s for s in dict.fromkeys(added) if s not in self._claim_cursors]
        for stream in new:
            self._claim_cursors[stream] = "0-0"
            self._new_offsets[stream] = ">"
            self._names[stream.encode()] = stream
        if new:
            self._streams = (*self._streams, *new)
            if self._order is not None:
                self._streams = tuple(sorted(self._streams, key=self._order))
        return new

    def _discover_streams(self) -> None:
        """Call ``discover`` (when due) and queue what it names."""
        if self._discover is None:
            return
        self._next_discover = monotonic() + self._discover_every
        try:
            found = list(self._discover())
            new = [s for s in found if s not in self._claim_cursors]
            self.add_streams(new)
        except redis.RedisError:
            raise  # Redis weather or worse: the loop's own handling
        except Exception:
            logger.warning(
                "consumer %s: discovering streams failed; tried again in %.1fs",
                self._consumer,
                self._discover_every,
                exc_info=True,
            )
            return

    def _follow_new(self) -> None:
        """Join queued streams while established: group first, then own pending."""
        new = self._join_added()
        if not new:
            return
        for stream in new:
            self._create_group(stream)
        logger.info("consumer %s: now also listening to %s", self._consumer, ", ".join(new))
        self._recover_own(new)

    # -- the loop ------------------------------------------------------------------
    def listen(self, max_events: int | None = None, idle_timeout: float | None = None) -> int:
        """Process events until stopped; return how many were handled.

        ``max_events``: return after handling that many entries (acknowledged or
        dead-lettered; with several streams one read may bring up to ``batch_size``
        from each, all handled). ``idle_timeout``: return once no entry arrived for that
        many seconds. Both are for tests, scripts and benchmarks; a worker passes
        neither. A stop requested before ``listen()`` makes it return at once.
        """
        if self._running:
            raise RuntimeError(f"listener {self._consumer} is already listening")
        self._running = True
        start = self.stats.handled
        forced = False
        if self._handle_signals:
            self._signals.install()
        self._lease.start()
        try:
            self.onStart()
            logger.info(
                "consumer %s: listening to %s as group %s at %s",
                self._consumer,
                ", ".join(self._streams),
                self._group,
                self.location,
            )
            self._loop(max_events, idle_timeout, start)
        except BaseException as e:
            forced = not isinstance(e, Exception)
            raise
        finally:
            timer, self._drain_timer = self._drain_timer, None
            if timer is not None:
                timer.cancel()
            self._lease.stop()
            self._signals.restore()
            self._close_reader()
            self._running = False
            self._established = False
            if self._signals.received:
                logger.info(
                    "consumer %s: stopped on signal %s", self._consumer, self._signals.received
                )
            self._signals.received = None
            self._stopping.clear()
            if not forced:
                self.onStop()
        return self.stats.handled - start

    def _loop(self, max_events: int | None, idle_timeout: float | None, start: int) -> None:
        self._limit = None if max_events is None else start + max_events
        last_entry = monotonic()
        # One step per turn, so the room left under max_events is checked before each.
        while not self._stopping.is_set() and self._room() > 0:
            received = self.stats.received
            try:
                if not self._established:
                    self._establish()
                else:
                    # Writes a batch left for the next read go first when another step
                    # comes before that read.
                    if self._discover is not None and monotonic() >= self._next_discover:
                        self._flush_deferred()
                        self._discover_streams()
                    if self._added:
                        self._flush_deferred()
                        self._follow_new()
                    if monotonic() >= self._next_claim:
                        self._flush_deferred()
                        self._claim()
                    else:
                        self._read_new(self._block_time(idle_timeout, last_entry))
                    # Back only once a step past establishing succeeds: under OOM the
                    # group can exist and reads pass while every write is refused.
                    self._reconnect.reset()
                    self._forecast.clear()
            except Exception as e:
                self._on_error(e)
                continue
            now = monotonic()
            if self.stats.received != received:
                last_entry = now
            elif idle_timeout is not None and now - last_entry >= idle_timeout:
                break
        if self._deferred is not None:  # the last batch's writes, before returning
            try:
                self._flush_deferred()
            except Exception as e:
                self._on_error(e)  # left pending: read again by whoever listens next

    def _room(self) -> int:
        """Entries the next read may return: batch_size, or fewer under max_events."""
        if self._limit is None:
            return self._batch_size
        return min(self._batch_size, self._limit - self.stats.handled)

    def _block_time(self, idle_timeout: float | None, last_entry: float) -> int | None:
        """Milliseconds the next read may block: at most until a claim scan or the idle
        deadline is due; None means do not block."""
        now = monotonic()
        limit = min(self._block_ms / 1000, self._next_claim - now)
        if self._discover is not None:
            limit = min(limit, self._next_discover - now)
        if idle_timeout is not None:
            limit = min(limit, last_entry + idle_timeout - now)
        block = int(limit * 1000)
        return block if block >= 1 else None

    def _on_error(self, error: Exception) -> None:
        self._outbox.clear()
        self._deferred = None
        self._lease.clear()
        self._established = False
        self._close_reader()
        state = classify(error)
        if self._stopping.is_set() and state is not None:
            # Most likely the read this stop cut short; either way, no retry is due.
            logger.debug("consumer %s: stopping after %s", self._consumer, error)
            return
        if isinstance(error, redis.ResponseError) and str(error).startswith(_GONE):
            # Stream or group deleted under us: create them again, no backoff needed.
            logger.warning("consumer %s: %s; re-creating the group", self._consumer, error)
            return
        if state is None:
            if isinstance(error, redis.RedisError):
                raise RedisCommandError(
                    f"consumer {self._consumer} of group {self._group} on "
                    f"{', '.join(self._streams)} at {self.location}: {error}"
                ) from error
            raise error  # not from Redis: a hook's own exception
        self.stats.reconnects += 1
        delay = self._reconnect.next_delay()
        self._forecast.storm(error, self.location, delay)
        if state == READONLY:
            # A failover made this server a replica; its name may point at the new
            # primary by now, which only new connections reach (idle ones are dropped,
            # those other threads use are theirs to lose).
            self._pool.disconnect(inuse_connections=False)
        self._stopping.wait(delay)

    def _establish(self) -> None:
        if self._reader is None:
            # Its own connection, held for the blocking reads (CLIENT UNBLOCK needs its id);
            # created here, inside the retry loop, as connecting may fail.
            self._reader = redis.Redis(connection_pool=self._pool, single_connection_client=True)
        self._discover_streams()
        self._join_added()
        for stream in self._streams:
            self._create_group(stream)
        self._established = True
        logger.debug("consumer %s: group %s established", self._consumer, self._group)
        if not self._checked_server:
            self._checked_server = True
            for warning in server_warnings(self._redis):
                logger.warning("consumer %s: %s (at %s)", self._consumer, warning, self.location)
        self.onEstablished()
        self._recover_own()

    def _create_group(self, stream: str) -> None:
        try:
            self._redis.xgroup_create(stream, self._group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if not str(e).startswith("BUSYGROUP"):  # a concurrent creator won: fine
                raise

    def _read_new(self, block_ms: int | None) -> None:
        if self._deferred is not None:
            self._flush_and_read(block_ms)
            return
        connection = self._reader_connection(block_ms)
        # Sent and read by hand: _blocking turns True only once the command is on its
        # way, so a CLIENT UNBLOCK from stop() finds it blocked; and the reply is taken
        # raw, without redis-py's per-entry post-processing (raw_stream_items does it in
        # one loop: a read is the listener's largest cost per entry after decoding).
        command = self._read_command(block_ms)
        along = self.read_along
        sent = monotonic()
        connection.send_packed_command(connection.pack_commands([command, *along]))  # type: ignore[no-untyped-call]
        self._blocking = block_ms is not None
        reply: Any = None
        try:
            if self._stopping.is_set():
                self._start_waking()
            reply = connection.read_response()
            self._blocking = False
            replies: list[Any] = []
            for _ in along:
                try:
                    replies.append(connection.read_response())
                except redis.ResponseError as error:  # the command's own answer
                    replies.append(error)
        except BaseException as error:
            connection.disconnect()  # type: ignore[no-untyped-call]  # reply half read?
            self._give_back_unhandled(reply, sent, error)
            raise
        finally:
            self._blocking = False
        self._handle_read(reply, replies if along else None)

    def _give_back_unhandled(self, reply: Any, sent: float, error: BaseException) -> None:
        """Weather cut short a round trip sent at ``sent``, holding a read: the entries
        its ``reply`` delivered go unhandled, their deliveries given back (or, the
        reply lost, by the next recovery)."""
        if isinstance(reply, BaseException) or not is_weather(error):
            return
        if reply is None:
            self._delivery_lost(sent, error)
            return
        for name, entries in raw_stream_items(reply):
            if entries:
                self._give_back(self._names[name], entries, (), None)

    def _reader_connection(self, block_ms: int | None) -> Any:
        """The reader's connection; its client id known first when the read may block
        (stop() unblocks it by that id)."""
        reader = self._reader
        assert reader is not None
        if block_ms is not None and self._reader_id is None:
            self._reader_id = int(reader.client_id())
        connection = reader.connection
        assert connection is not None
        return connection

    def _read_command(self, block_ms: int | None) -> tuple[Any, ...]:
        block = ("BLOCK", block_ms) if block_ms is not None else ()
        return (
            "XREADGROUP",
            "GROUP",
            self._group,
            self._consumer,
            "COUNT",
            self._room(),
            *block,
            "STREAMS",
            *self._streams,
            *[">"] * len(self._streams),
        )

    def _handle_read(self, reply: Any, along: list[Any] | None) -> None:
        """Handle what one read of new entries brought (``along``: read_along's replies)."""
        self.read_replies = along
        try:
            got = [(self._names[name], entries) for name, entries in raw_stream_items(reply)]
            got = [(stream, entries) for stream, entries in got if entries]
            for n, (stream, entries) in enumerate(got):
                last = n == len(got) - 1
                try:
                    self._handle(stream, entries, None, defer=last and self.flush_with_next_read)
                except Exception as error:
                    if is_weather(error):  # the streams not reached were delivered too
                        for later, rest in got[n + 1 :]:
                            self._give_back(later, rest, (), None)
                    raise
        finally:
            self.read_replies = None

    def _flush_and_read(self, block_ms: int | None) -> None:
        """The deferred batch's transaction, then the read, in one round trip of the
        reader's connection: the transaction's replies come at once, the read's may
        wait (``block_ms``), cut short by stop() as any read."""
        assert self._deferred is not None
        stream, entries, counts = self._deferred
        self._deferred = None
        writes = self._outbox.commands(self._group)
        noted = self._noted_acks()
        self._outbox.clear()
        connection = self._reader_connection(block_ms)
        along = self.read_along
        transaction = [("MULTI",), *writes, ("EXEC",)] if writes else []
        written: list[Any] | None = None
        reply: Any = None
        sent = monotonic()
        try:
            send(connection, [*transaction, self._read_command(block_ms), *along])
            written = read(connection, len(transaction))
            self._blocking = block_ms is not None
            if self._stopping.is_set():
                self._start_waking()
            (reply,) = read(connection, 1)
            self._blocking = False
            replies = read(connection, len(along)) if along else []
        except Exception as error:
            connection.disconnect()  # type: ignore[no-untyped-call]  # replies half read?
            self._lease.clear()
            failure: Exception | None = error
        except BaseException:  # an interrupt or an exit goes up as it is
            connection.disconnect()  # type: ignore[no-untyped-call]
            self._lease.clear()
            raise
        else:
            failure = None
        finally:
            self._blocking = False
        if failure is not None:
            # Out of the except block: an error the cut raises is not chained to this one
            # (a chain would make a real refusal look like the connection's weather).
            cut = (stream, entries, counts, noted, bool(transaction))
            self._round_trip_cut(failure, *cut, written, reply, sent)
            raise failure
        try:
            self._check_deferred(written, stream, entries, counts)
        except Exception as error:
            self._give_back_unhandled(reply, sent, error)
            raise
        self._drop_notes(noted)
        if isinstance(reply, BaseException):
            raise reply
        self._handle_read(reply, replies if along else None)

    def _round_trip_cut(
        self,
        error: Exception,
        stream: str,
        entries: Sequence[Entry],
        counts: dict[bytes, int] | None,
        noted: Sequence[tuple[str, bytes]],
        writes: bool,
        written: list[Any] | None,
        reply: Any,
        sent: float,
    ) -> None:
        """``error`` cut short the round trip of a deferred batch's transaction and a
        read: what the read delivered is given back (or, its reply lost, recorded for
        the next recovery), then the batch: refused, or with its fate unknown, its
        deliveries are given back too."""
        self._give_back_unhandled(reply, sent, error)
        if self._lost_delivery is not None:  # the batch was delivered before the read
            self._not_lost.update((stream, entry_id) for entry_id, _ in entries)
        if written is not None:
            self._check_deferred(written, stream, entries, counts)
            self._drop_notes(noted)
        elif writes and is_weather(error):  # ran or not: if not, not counted
            self._give_back(stream, entries, (), counts)

    def _check_deferred(
        self,
        written: list[Any] | None,
        stream: str,
        entries: Sequence[Entry],
        counts: dict[bytes, int] | None,
    ) -> None:
        """Raise what refused the deferred batch's transaction (its ``written``
        replies); weather gives back its entries' deliveries."""
        try:
            if written:
                transaction_replies(written)
        except Exception as error:
            if is_weather(error):  # nothing was written: give every delivery back
                self._give_back(stream, entries, (), counts)
            raise
        finally:
            self._lease.clear()

    # -- waking and stopping -------------------------------------------------------
    def _wake(self) -> None:
        """Cut a blocking read short (CLIENT UNBLOCK); best effort, block_ms bounds it.

        The read is sent before ``_blocking`` is set, but on another connection
        than this command: if Redis has not seen it yet, try twice more shortly.
        """
        pause = threading.Event()
        for _ in range(3):
            reader_id = self._reader_id
            if reader_id is None or not self._blocking:
                return
            try:
                if self._redis.client_unblock(reader_id):
                    return
            except redis.RedisError as e:
                logger.debug("consumer %s: CLIENT UNBLOCK failed: %s", self._consumer, e)
                return
            pause.wait(0.002)

    def _start_waking(self) -> None:
        """Cut a blocking read short from other threads: CLIENT UNBLOCK at once, and
        if the read still blocks after a moment (Redis not answering), its socket
        is shut down, which ends the read with a connection error."""
        if not self._blocking:
            return
        threading.Thread(target=self._wake, name="rqse-wake", daemon=True).start()
        grace = min(1.0, self._drain_timeout / 2)
        cutter = threading.Timer(grace, self._cut_reader, args=(self._reader,))
        cutter.daemon = True
        cutter.start()

    def _cut_reader(self, reader: redis.Redis | None) -> None:
        # Only the read it was started for: listen() may have returned and begun anew.
        if reader is None or reader is not self._reader or not self._blocking:
            return
        sock = getattr(reader.connection, "_sock", None)
        if sock is None:
            return
        logger.debug("consumer %s: Redis did not unblock the read; closing it", self._consumer)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def _on_signal(self, signum: int) -> None:
        """First signal: stop after the event in hand, within ``drain_timeout``.
        Second (or the drain timeout passing): exit now."""
        if self._stopping.is_set() and self._signals.received:
            raise SystemExit(128 + signum)
        self._signals.received = signum
        self._stopping.set()
        # Not from the handler itself: it may have interrupted this thread
        # inside the connection pool.
        self._start_waking()
        timer = threading.Timer(self._drain_timeout, self._drain_expired, args=(signum,))
        timer.daemon = True
        self._drain_timer = timer
        timer.start()

    def _drain_expired(self, signum: int) -> None:
        """The drain timeout passed: signal the main thread again, so its handler
        raises SystemExit there (interrupting a call blocked on a socket, too)."""
        if not self._running or self._drain_timer is None:
            return
        logger.warning(
            "consumer %s: not stopped %.1fs after signal %s; exiting now",
            self._consumer,
            self._drain_timeout,
            signum,
        )
        main = threading.main_thread().ident
        if main is not None:
            signal.pthread_kill(main, signum)

    def _close_reader(self) -> None:
        reader, self._reader, self._reader_id = self._reader, None, None
        if reader is not None:
            with contextlib.suppress(redis.RedisError):
                reader.close()
