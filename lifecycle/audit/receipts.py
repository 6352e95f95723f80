"""The receipts worker: archive every entry of every engine stream, exactly once.

It reads ``{flow}:lifecycle``, every ``{flow}:tasks:<kind>`` (kinds from
``{flow}:kinds``, rescanned while running) and ``{flow}:tasks:<kind>:p<N>`` (from
``{flow}:priorities``) and their ``:dead`` streams in id
order with XREAD, from the last id the archive holds per stream, writes each
entry to a :class:`lifecycle.archive.Sink`, flushes (fsync) and only then moves
its consumer group's last-delivered-id there (XGROUP SETID). Exactly once
across crashes:

* at least once, because the archive is where reading resumes: a SIGKILL before
  the fsync loses the batch from the archive, and a restart reads it again;
* at most once, because reading resumes after the last archived id, and a
  stream's ids only grow.

The group holds no pending entries (reading it with XREADGROUP would make Redis
record and then forget every entry once more); it marks how far the archive
is (its last-delivered-id; XINFO's lag is not kept for it), for trimming and
for operators. Entries an older receipts worker left
pending in it are archived and acknowledged at start. That argument needs one
receipts worker per archive and partition; the archive directory's lock
enforces the first half. The worker also trims the engine streams with rqse's
``trim_acknowledged`` (only entries every group, this one included, is past),
so streams stay bounded; never a stream whose receipts group is missing or
ahead of the archive.

It stops only when told (``stop()``, SIGTERM/SIGINT through
:mod:`rqse.shutdown`). An entry it cannot decode is archived with the value raw
(:func:`lifecycle.archive.entry_record`); a disk that refuses the flush is
retried with backoff, said once per state, and nothing moves past it; any other
error is logged and backed off from, the unflushed batch dropped and read again.
The line format, including the fast path that copies values as written, is
:mod:`lifecycle.audit.archive`'s; the files are :mod:`lifecycle.audit.segments`'.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hiredis
import orjson
import redis

from lifecycle.audit.archive import (
    ArchiveError,
    EntryShape,
    EntryShapes,
    Sink,
    check_values,
    each_json,
    entry_record,
    fits_a_line,
    id_order,
    raw_record,
)
from lifecycle.events import END_TASKS, START_TASKS, START_WORKFLOW
from lifecycle.keys import LIFECYCLE_GROUP, RECEIPTS_GROUP, TASK_GROUP, Keys
from lifecycle.priorities import priority_streams
from rqse.backoff import Backoff
from rqse.events import has_long_digits
from rqse.fastpipe import execute
from rqse.keys import DEAD_LETTER_SUFFIX, dead_letter_key
from rqse.shutdown import SignalHandlers
from rqse.trim import trim_acknowledged
from rqse.weather import describe, is_weather

__all__ = ["ReceiptsStats", "ReceiptsWorker"]

log = logging.getLogger(__name__)

_loads = orjson.loads
_dumps = orjson.dumps
RECEIPTS_GROUP_BYTES = RECEIPTS_GROUP.encode()
DEFAULT_CONSUMER = "receipts"  # stable: finds what an older worker of this name left pending
_pack: Callable[[tuple[str | int, ...]], bytes] = hiredis.pack_command  # type: ignore[assignment]
_CHECKED_TOGETHER = 128  # entries whose values one parse checks (all_plain)
_START_WORKFLOW_JSON = _dumps(START_WORKFLOW)


def _order(entry_id: bytes) -> int:
    """An entry id as one sortable int, ordered as :func:`lifecycle.archive.id_order`:
    both halves are 64-bit, so ``ms << 64 | seq`` orders as the pair does."""
    ms, _, seq = entry_id.partition(b"-")
    return int(ms) << 64 | int(seq or 0)


@dataclass
class ReceiptsStats:
    archived: int = 0  # entries written
    skipped: int = 0  # entries an older worker left pending that the archive holds already
    gone: int = 0  # entries an older worker left pending, deleted before they were archived
    batches: int = 0
    read_ahead: int = 0  # XREADs sent before the batch in hand was archived (a backlog)
    trimmed: int = 0
    raw: int = 0  # entries archived with a value kept raw (lifecycle.archive.entry_record)
    refused_flushes: int = 0  # flushes the sink refused (disk full, read-only), retried
    errors: int = 0  # unexpected errors the loop logged and backed off from
    peak_lengths: dict[str, int] = field(default_factory=dict)  # XLEN seen before each trim


class ReceiptsWorker:
    """Archive the engine's streams into ``sink``. ``run()`` until ``stop()`` or a signal.

    It never stops on its own for what an entry holds (an undecodable value is archived
    raw) or for a disk that refuses writes (flushes are retried with backoff, saying so
    once per state, and nothing is acknowledged or trimmed past what is durable). After
    ``stop()`` (or SIGTERM/SIGINT, with :meth:`install_signal_handlers`) it finishes the
    batch in hand for at most ``drain_timeout`` seconds; a batch the disk still refuses
    then is left to be read again at the next start.

    ``linger``: after a batch that was not full (the worker keeps up), the seconds it
    waits before it reads again, so that the next batch is fuller: every batch costs a
    write, an fsync and its round trips whatever it holds. Entries are archived that
    much later; behind a backlog it never waits.

    ``trim_every``: seconds between two trims of every stream (None: never trim).
    ``trim_after``: a stream is also trimmed as soon as this many of its entries were
    archived since its last trim, a pack (start-tasks, end-tasks) counting one per
    :data:`PACK_TRIM_BYTES` it holds, about one per task. Under load, what a trim frees
    arrives faster than once a second; an acknowledged entry kept until then is memory
    at the peak (about 35,000 entries a second on the 1M-task benchmark, or as many
    tasks in packs).
    """

    def __init__(
        self,
        client: redis.Redis,
        sink: Sink,
        keys: Keys | None = None,
        *,
        consumer: str = DEFAULT_CONSUMER,
        batch_size: int = 1000,
        block_ms: int = 500,
        rescan_every: float = 1.0,
        linger: float = 0.02,
        trim_every: float | None = 1.0,
        trim_after: int = 5000,
        drain_timeout: float = 10.0,
        retry_max: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.sink = sink
        self.keys = keys or Keys()
        self.consumer = consumer
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.rescan_every = rescan_every
        self.linger = linger
        self.trim_every = trim_every
        self.trim_after = trim_after
        self.drain_timeout = drain_timeout
        if trim_after < 1:
            raise ValueError(f"trim_after must be 1 or more entries, got {trim_after!r}")
        if not retry_max > 0:
            raise ValueError(f"retry_max must be > 0 seconds, got {retry_max!r}")
        self.retry_max = retry_max  # longest wait between two tries (refused flushes, errors)
        self.clock = clock
        self.stats = ReceiptsStats()
        self.streams: list[str] = []
        self._last = sink.last_ids()
        self._positions: dict[str, str] = {}  # stream -> the id XREAD reads after
        self._untrimmed: dict[str, int] = {}  # stream -> entries archived since its trim
        # A connection whose XREAD of the next batch went out before this batch was
        # archived (a backlog: Redis prepares it meanwhile); its reply not read yet.
        self._ahead: Any = None
        # A sink that takes entries encoded (SegmentSink) gets them so.
        self._write_encoded: Callable[[list[Any], dict[str, str]], None] | None = getattr(
            sink, "write_encoded", None
        )
        self._shapes: dict[str, EntryShapes] = {}
        self._stopping = threading.Event()
        self._deadline = float("inf")  # once stopping: when the batch in hand is given up
        self._signals = SignalHandlers(self._on_signal)
        self._said: set[str] = set()  # keys whose problem was logged (_say_once)
        self._recorded = False  # whether keys.archive names this worker's archive yet

    # -- control -------------------------------------------------------------------
    def stop(self) -> None:
        """Finish the batch in hand (within ``drain_timeout``), then return from
        ``run()``; idempotent, thread-safe."""
        if not self._stopping.is_set():
            self._deadline = self.clock() + self.drain_timeout
            self._stopping.set()

    def install_signal_handlers(self) -> bool:
        """SIGTERM/SIGINT: stop after the batch in hand; a second one exits at once
        (``SystemExit(128 + signum)``: nothing unflushed was acknowledged). Only from
        the main thread; True if installed. ``run()`` restores the previous handlers."""
        return self._signals.install()

    def _on_signal(self, signum: int) -> None:
        # Only flags: the loop sees them between two steps.
        if self._stopping.is_set() and self._signals.received:
            raise SystemExit(128 + signum)
        self._signals.received = signum
        self.stop()

    def run(self, idle_timeout: float | None = None) -> ReceiptsStats:
        """Archive until stopped (or until nothing arrived for ``idle_timeout`` seconds)."""
        next_rescan = next_trim = 0.0
        last_entry = self.clock()
        backoff = Backoff(initial=min(0.5, self.retry_max), maximum=self.retry_max)
        try:
            while not self._stopping.is_set():
                try:
                    now = self.clock()
                    if now >= next_rescan:
                        self._discover()
                        next_rescan = now + self.rescan_every
                    if self.trim_every is not None:
                        if now >= next_trim:
                            self._trim()
                            next_trim = now + self.trim_every
                        elif busy := self._busy_streams():
                            self._trim(busy)
                    if self._read(self.block_ms):
                        last_entry = self.clock()
                        if self._ahead is None and self.linger > 0:  # keeping up
                            self._stopping.wait(self.linger)
                    elif idle_timeout is not None and self.clock() - last_entry >= idle_timeout:
                        break
                    backoff.reset()
                except _Stopped:
                    break
                except redis.ConnectionError as error:
                    # Redis away: reading resumes from the archive's last ids once the
                    # streams are joined again.
                    log.warning("receipts: Redis unavailable (%s); retrying in 1s", error)
                    self._discard()
                    self.streams = []
                    self._stopping.wait(1.0)
                    next_rescan = 0.0
                except Exception as error:  # noqa: BLE001 - logged; the loop is the last line
                    # Whatever went wrong, nothing unflushed was acknowledged: rejoin the
                    # streams (positions from the archive) and try again, backing off.
                    delay = backoff.next_delay()
                    if is_weather(error):  # a cluster failing over (CLUSTERDOWN), OOM, ...
                        log.warning("receipts: %s; retrying in %.1fs", describe(error), delay)
                    else:
                        self.stats.errors += 1
                        log.exception("receipts: unexpected error; retrying in %.1fs", delay)
                    self._discard()
                    self.streams = []
                    self._stopping.wait(delay)
                    next_rescan = 0.0
        finally:
            self._drop_read_ahead()
            self._signals.restore()
            if self._signals.received:
                log.info("receipts: stopped on signal %s", self._signals.received)
        try:
            self.sink.flush()  # a sink other than SegmentSink may hold writes until now
        except (ArchiveError, OSError) as error:
            log.warning("receipts: last flush refused (%s); read again at the next start", error)
        return self.stats

    def _flush(self) -> None:
        """Flush the sink until it takes the batch; the disk refusing (full, read-only)
        is retried with backoff and said once per state ("archive disk full at PATH;
        retrying"), and once more when it passes. Stopped meanwhile, and past the drain
        deadline, the batch is given up (:class:`_Stopped`): nothing was acknowledged."""
        backoff = Backoff(initial=min(0.05, self.retry_max), maximum=self.retry_max)
        said: str | None = None
        while True:
            try:
                self.sink.flush()
            except (ArchiveError, OSError) as error:
                self.stats.refused_flushes += 1
                state = str(error)
                if state != said:
                    log.error("%s; retrying", state)
                    said = state
                if not self._pause(backoff.next_delay()):
                    self._discard()
                    log.warning("receipts: stopping with the batch in hand not archived (%s)", said)
                    raise _Stopped from None
                continue
            if said is not None:
                log.warning("receipts: archive writable again (was: %s); archiving resumes", said)
            return

    def _discard(self) -> None:
        """Drop what the sink holds unflushed, and a read sent ahead: those entries are
        read again (from the archive's last ids), and must not be archived twice."""
        self._drop_read_ahead()
        discard = getattr(self.sink, "discard", None)
        if discard is not None:
            discard()

    def _pause(self, delay: float) -> bool:
        """Wait ``delay`` seconds before another try; False once stopping and past the
        drain deadline (the wait ends there)."""
        if not self._stopping.is_set():
            self._stopping.wait(delay)
            if not self._stopping.is_set():
                return True
        remaining = self._deadline - self.clock()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        return True

    # -- steps ---------------------------------------------------------------------
    def _discover(self) -> None:
        """Join every engine stream not joined yet: archive what an older worker left
        pending in the group, then read on from the archive's last id (or the group's,
        if further: an archive started after the group sees what comes next)."""
        keys = self.keys
        if not self._recorded:
            self._record_archive()
        try:
            kinds = self.client.smembers(keys.kinds)
        except redis.ResponseError as error:  # not a set: the task streams wait for one
            self._say_once(keys.kinds, f"{keys.kinds}: task kinds not readable ({error})")
            kinds = set()
        try:
            members = self.client.smembers(keys.priorities)
        except redis.ResponseError as error:  # not a set: kinds' own streams are archived
            self._say_once(keys.priorities, f"{keys.priorities}: not readable ({error})")
            members = set()
        bases = [keys.lifecycle] + sorted(
            keys.tasks(kind.decode() if isinstance(kind, bytes) else str(kind)) for kind in kinds
        )
        bases += sorted(priority_streams(keys, members))
        wanted = [s for base in bases for s in (base, dead_letter_key(base))]
        new = []
        for stream in wanted:
            if stream in self.streams:
                continue
            dead = stream.endswith(DEAD_LETTER_SUFFIX)
            if dead and not self.client.exists(stream):
                continue  # created by the first dead letter; joined at a later rescan
            try:
                # Id 0: the group sees everything the stream still holds, from before our start.
                self.client.xgroup_create(stream, RECEIPTS_GROUP, id="0", mkstream=not dead)
            except redis.ResponseError as error:
                if "BUSYGROUP" not in str(error):
                    # Not a stream (WRONGTYPE): the others are archived all the same;
                    # tried again at every rescan.
                    self._say_once(stream, f"{stream}: not archived ({error})")
                    continue
            new.append(stream)
        for stream in new:
            self._claim_orphans(stream)
            while self._read_pending(stream):
                pass
            group = next(
                g for g in self.client.xinfo_groups(stream) if g["name"] == RECEIPTS_GROUP_BYTES
            )
            delivered = group["last-delivered-id"]
            delivered = delivered.decode() if isinstance(delivered, bytes) else delivered
            archived = self._last.get(stream)
            self._positions[stream] = (
                archived if archived and id_order(archived) >= id_order(delivered) else delivered
            )
        self.streams.extend(new)

    def _record_archive(self) -> None:
        """Say where this worker archives (``keys.archive``), for ``history`` and
        ``inspect`` to name instead of a placeholder. Only a sink on a directory has a
        place to name; a user not allowed SET only loses that (said once)."""
        directory = getattr(self.sink, "directory", None)
        if directory is None:
            self._recorded = True
            return
        record = {"path": str(Path(directory).resolve()), "host": socket.gethostname()}
        try:
            self.client.set(self.keys.archive, orjson.dumps(record))
        except redis.ResponseError as error:  # no right to SET it: archiving goes on
            self._say_once(self.keys.archive, f"{self.keys.archive}: not recorded ({error})")
        self._recorded = True

    def _say_once(self, key: str, message: str) -> None:
        """Log a problem with a key once (it is met again at every rescan)."""
        if key not in self._said:
            self._said.add(key)
            log.error("receipts: %s", message)

    def _claim_orphans(self, stream: str) -> None:
        """Take over entries a previous receipts consumer of another name left pending."""
        cursor = "0-0"
        while True:
            reply = self.client.xautoclaim(
                stream, RECEIPTS_GROUP, self.consumer, 0, cursor, count=1000
            )
            cursor = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
            if cursor == "0-0":
                return

    def _read(self, block_ms: int | None) -> int:
        """One XREAD of every stream from its position (or the reply of the one sent
        ahead); archive, then move the group. Returns the number of entries read."""
        streams = self.streams
        if not streams:
            return 0
        positions = self._positions
        reply = self._read_ahead_reply()
        if not reply:
            reply = self._reply(self._xread(streams, positions, block_ms))
        self._send_read_ahead(reply)
        read = self._archive(reply)
        if not read:
            return 0
        last = {stream: entries[-1][0].decode() for stream, entries in read.items()}
        positions.update(last)
        untrimmed = self._untrimmed
        for stream, entries in read.items():
            untrimmed[stream] = untrimmed.get(stream, 0) + sum(_trim_weight(f) for _, f in entries)
        self._send(
            [("XGROUP", "SETID", stream, RECEIPTS_GROUP, id_) for stream, id_ in last.items()]
        )
        return sum(map(len, read.values()))

    def _xread(
        self, streams: list[str], positions: dict[str, str], block_ms: int | None
    ) -> list[str | int]:
        command: list[str | int] = ["XREAD", "COUNT", self.batch_size]
        if block_ms is not None:
            command += ["BLOCK", block_ms]
        return [*command, "STREAMS", *streams, *[positions[s] for s in streams]]

    def _send_read_ahead(self, reply: Any) -> None:
        """After a full batch (a backlog), send the next XREAD now, without blocking,
        from after this batch, on a connection of its own: Redis prepares the next
        batch while this one is archived and fsync'd. Its reply is read by the next
        ``_read``; if this batch is not archived after all, it is dropped unread
        (:meth:`_discard`) and reading starts again from the archive."""
        if not reply:  # nothing new: XREAD timed out
            return
        pairs = list(reply.items() if isinstance(reply, dict) else reply)
        if not any(len(entries or ()) >= self.batch_size for _, entries in pairs):
            return
        positions = dict(self._positions)
        for name, entries in pairs:
            if entries:
                positions[name.decode()] = entries[-1][0].decode()
        command = self._xread([s for s in self.streams if s in positions], positions, None)
        connection = self.client.connection_pool.get_connection()
        try:
            connection.send_packed_command([_pack(tuple(command))])
        except BaseException:
            self._release(connection, broken=True)
            raise
        self._ahead = connection
        self.stats.read_ahead += 1

    def _read_ahead_reply(self) -> Any:
        """The reply of the XREAD sent ahead, or None if none was."""
        connection, self._ahead = self._ahead, None
        if connection is None:
            return None
        try:
            reply = connection.read_response()
        except BaseException:
            self._release(connection, broken=True)
            raise
        self._release(connection, broken=False)
        return reply

    def _drop_read_ahead(self) -> None:
        """Forget the XREAD sent ahead: its connection, reply unread, is closed."""
        connection, self._ahead = self._ahead, None
        if connection is not None:
            self._release(connection, broken=True)

    def _release(self, connection: Any, *, broken: bool) -> None:
        if broken:  # replies may be out of step with commands: never reuse it as it is
            connection.disconnect()
        self.client.connection_pool.release(connection)

    def _read_pending(self, stream: str) -> int:
        """Entries this consumer holds pending in the group (left by an older worker):
        archive those not archived yet, acknowledge all. Returns how many were read."""
        command: list[str | int] = ["XREADGROUP", "GROUP", RECEIPTS_GROUP, self.consumer]
        command += ["COUNT", self.batch_size, "STREAMS", stream, "0"]
        entries = self._archive(self._reply(command)).get(stream)
        if not entries:
            return 0
        self._send([("XACK", stream, RECEIPTS_GROUP, *[entry[0] for entry in entries])])
        return len(entries)

    def _reply(self, command: list[Any]) -> Any:
        # The raw reply (hiredis): RESP2 [[stream, entries], ...], RESP3 {stream: entries},
        # an entry [id, [name, value, ...]] or [id, None] once deleted; None on a timeout.
        # redis-py's reply post-processing (tuples, a dict per entry) cost a quarter of a batch.
        (reply,) = execute(self.client, [command])
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def _send(self, commands: list[Any]) -> None:
        for reply in execute(self.client, commands):
            if isinstance(reply, BaseException):
                raise reply

    def _archive(self, reply: Any) -> dict[str, list[Any]]:
        """Write the entries of an XREAD/XREADGROUP reply to the sink and flush: return
        the entries read, per stream. Entries at or below the archive's last id of their
        stream (left pending by an older worker) are skipped, not written twice."""
        if not reply:
            return {}
        batch: list[Any] = []
        graphs: set[str] = set()  # archived by this batch
        # The last ids of this batch become "archived" only once the sink has flushed:
        # an error before that (a Redis call in _add_graph, the disk) must leave the
        # entries to be read and archived again, not skipped as already archived.
        read: dict[str, list[Any]] = {}
        written: dict[str, str] = {}
        archived = 0
        for name, entries in reply.items() if isinstance(reply, dict) else reply:
            if not entries:
                continue
            stream = name.decode()
            read[stream] = entries
            entries = self._unarchived(stream, entries)
            if not entries:
                continue
            written[stream] = entries[-1][0].decode()
            archived += len(entries)
            if self._write_encoded is not None:
                self._add_encoded(stream, entries, batch, graphs)
            else:
                for entry_id, fields in entries:
                    self._add_decoded(stream, entry_id, fields, batch, graphs)
        if batch:
            if self._write_encoded is not None:
                self._write_encoded(batch, written)
            else:
                self.sink.write(batch)
            self._flush()  # durable before the group moves: the whole guarantee
            self.stats.archived += archived
            self._last.update(written)
        if read:
            self.stats.batches += 1
        return read

    def _unarchived(self, stream: str, entries: list[Any]) -> list[Any]:
        """``entries`` but those the archive holds already (left pending by an older
        worker): ids grow, so only a prefix can be archived."""
        last = self._last.get(stream)
        if last is None:
            return entries
        last_order = _order(last.encode())
        start = 0
        while start < len(entries) and _order(entries[start][0]) <= last_order:
            start += 1
        self.stats.skipped += start
        return entries[start:] if start else entries

    def _add_encoded(
        self, stream: str, entries: list[Any], batch: list[Any], graphs: set[str]
    ) -> None:
        """Add the entries' records to ``batch`` encoded from their own JSON values
        (``SegmentSink.write_encoded``), not decoded and encoded again. Their values are
        checked a chunk at a time (:func:`check_values`): in a chunk that cannot be
        checked so (its values hold null, false and true, or one is not JSON) each
        entry's values are parsed on their own, and in one with many brackets each
        record's brackets are counted (:func:`fits_a_line`)."""
        shapes = self._shapes.get(stream) or self._shapes.setdefault(stream, EntryShapes(stream))
        for start in range(0, len(entries), _CHECKED_TOGETHER):
            self._add_chunk(shapes, entries[start : start + _CHECKED_TOGETHER], batch, graphs)

    def _add_chunk(
        self, shapes: EntryShapes, entries: list[Any], batch: list[Any], graphs: set[str]
    ) -> None:
        """The worker's hot loop. An entry that is not plain is decoded instead
        (:meth:`_add_decoded`): a name not UTF-8 or repeated, a value that is not JSON
        on its own, a record that would not make a line (:func:`fits_a_line`)."""
        stream = shapes.stream
        values_lists = [fields[1::2] if fields else None for _, fields in entries]
        checked, shallow, text = check_values(values_lists)
        # An integer past 64 bits is kept raw (entry_record): entries with 19 digits in
        # a row, rare (ids and ms times have 13), take the decoding path, which tells.
        long_digits = has_long_digits(text)
        # The chunk's values all copied as written (the common case): a record per entry
        # whose shape is known, without a check per entry.
        plain = checked and shallow and not long_digits
        names_before: list[bytes] | None = None
        shape: EntryShape | None = None  # that of names_before
        append = batch.append
        for (entry_id, fields), values in zip(entries, values_lists, strict=True):
            if fields:
                names = fields[0::2]
                # Consecutive entries mostly share their names: a comparison with the
                # last ones costs less than a tuple of them and a lookup.
                if names != names_before:
                    names_before, shape = names, shapes.of(names)
                if plain and shape is not None and values is not None:
                    if shape.start_at is not None:
                        self._add_started_graph(shape.start_at, values, batch, graphs)
                    append(shape.record % (entry_id, *values))
                    continue
            record = None
            if long_digits and values is not None and any(map(has_long_digits, values)):
                shape = names_before = None  # the next entry looks its shape up again
            if values is not None and shape is not None and (checked or each_json(values)):
                record = shape.record % (entry_id, *values)
                if not ((checked and shallow) or fits_a_line(record)):
                    record = None
            if record is None or shape is None or values is None:
                self._add_decoded(stream, entry_id, fields, batch, graphs)
                continue
            if shape.start_at is not None:
                self._add_started_graph(shape.start_at, values, batch, graphs)
            append(record)

    def _add_started_graph(
        self, start_at: tuple[int, int], values: list[bytes], batch: list[Any], graphs: set[str]
    ) -> None:
        """Before a start-workflow, its graph (values checked as JSON already)."""
        kind_at, graph_at = start_at
        kind = values[kind_at]
        # The engine's own spelling is known at a glance; any other is parsed.
        if kind == _START_WORKFLOW_JSON or _loads(kind) == START_WORKFLOW:
            self._add_graph(_loads(values[graph_at]), batch, graphs)

    def _add_decoded(
        self,
        stream: str,
        entry_id: bytes,
        fields: list[bytes] | None,
        batch: list[Any],
        graphs: set[str],
    ) -> None:
        """Add the entry's record to ``batch`` with its event decoded (a value that is
        not JSON kept as text), or marked gone if it was deleted before it was read.
        The record is encoded here, once: a value it cannot hold is found now and kept
        as text, rather than failing the batch in the sink at every start."""
        id_text = entry_id.decode()
        if not fields:
            self.stats.gone += 1
        try:
            record = entry_record(stream, id_text, fields)
            if record.get("event", {}).get("kind") == START_WORKFLOW:
                self._add_graph(record["event"].get("graph"), batch, graphs)
            line = _dumps(record)
        except redis.RedisError:
            raise  # the graph's GET: the loop's business
        except Exception:  # noqa: BLE001 - an entry must never stop the worker
            log.exception("%s %s: archived raw (not encodable)", stream, id_text)
            record = raw_record(stream, id_text, fields or [])
            line = _dumps(record)
        if "raw" in record:
            self.stats.raw += 1
            log.warning(
                "%s %s: fields %s not decodable; archived raw (base64)",
                stream,
                id_text,
                ", ".join(sorted(record["raw"])),
            )
        # Without its opening brace, the line is the record as write_encoded takes it.
        batch.append(line[1:] if self._write_encoded is not None else record)

    def _add_graph(self, digest: Any, batch: list[Any], graphs: set[str]) -> None:
        """Archive the compiled graph a start-workflow names, the first time it is named:
        replay needs it, and it lives in a Redis key, not in any stream."""
        if not isinstance(digest, str) or digest in graphs or self.sink.has_graph(digest):
            return
        try:
            text = self.client.get(self.keys.graph(digest))
        except redis.ResponseError as error:
            # Not a string key (WRONGTYPE): the same at every try, so never retried;
            # the start-workflow is archived, and replay reports the missing graph.
            log.warning("graph %s: not archived (%s)", digest, error)
            return
        if isinstance(text, bytes):
            # Not UTF-8 (not the engine's writing): kept, and replay reports it (no hash match).
            batch.append({"graph": digest, "text": text.decode("utf-8", "replace")})
            graphs.add(digest)

    def _busy_streams(self) -> list[str]:
        """The streams with ``trim_after`` entries or more archived since their trim."""
        after = self.trim_after
        return [stream for stream, count in self._untrimmed.items() if count >= after]

    def _trim(self, streams: list[str] | None = None) -> None:
        """Trim ``streams`` (default: every one), lifecycle and task streams, to what
        every group has acknowledged.

        Only streams whose engine group exists: with the receipts group alone on a
        task stream, trimming would drop start-tasks no task worker has seen yet.
        Only streams whose receipts group exists and stands at or before what this
        worker archived: the trim's bound is the lowest group position, and a
        receipts group ahead of the archive (moved by hand, re-created, an archive
        restored from a backup) must not let unarchived entries go. Dead-letter
        streams are left for operators (they are archived all the same).
        """
        for stream in self.streams if streams is None else streams:
            self._untrimmed.pop(stream, None)
            if stream.endswith(DEAD_LETTER_SUFFIX):
                continue
            engine_group = LIFECYCLE_GROUP if stream == self.keys.lifecycle else TASK_GROUP
            groups = {g["name"].decode(): g for g in self.client.xinfo_groups(stream)}
            receipts = groups.get(RECEIPTS_GROUP)
            if engine_group not in groups or receipts is None:
                continue
            archived = self._last.get(stream)
            delivered = receipts["last-delivered-id"]
            delivered = delivered.decode() if isinstance(delivered, bytes) else str(delivered)
            if archived is None or id_order(delivered) > id_order(archived):
                continue
            length = int(self.client.xlen(stream))
            peak = self.stats.peak_lengths
            peak[stream] = max(peak.get(stream, 0), length)
            self.stats.trimmed += trim_acknowledged(self.client, stream).removed


# A pack's share of ``trim_after``: one per this many bytes of its tasks or answers (a
# chain's task is about as large), read from its size rather than decoded.
PACK_TRIM_BYTES = 256


_PACKS = frozenset({orjson.dumps(START_TASKS), orjson.dumps(END_TASKS)})


def _trim_weight(fields: list[bytes]) -> int:
    """An archived entry's share of ``trim_after`` (its raw fields, name and value in
    turn): one, or a pack's by its size (its builders write ``kind`` first)."""
    if (
        type(fields) is not list
        or len(fields) < 2
        or fields[1] not in _PACKS
        or fields[0] != b"kind"
    ):
        return 1
    return 1 + sum(map(len, fields[1::2])) // PACK_TRIM_BYTES


class _Stopped(Exception):
    """Stopping, with the batch in hand given up (internal to the worker)."""
