"""The receipts worker: archive every entry of every engine stream, exactly once.

It reads ``{flow}:lifecycle``, every ``{flow}:tasks:<kind>`` (kinds from
``{flow}:kinds``, rescanned while running) and their ``:dead`` streams in id
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
so streams stay bounded.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from lifecycle.archive import Sink, id_order
from lifecycle.events import START_WORKFLOW
from lifecycle.keys import LIFECYCLE_GROUP, RECEIPTS_GROUP, TASK_GROUP, Keys
from rqse.events import decode_lenient
from rqse.fastpipe import execute
from rqse.keys import dead_letter_key
from rqse.trim import trim_acknowledged

__all__ = ["ReceiptsStats", "ReceiptsWorker"]

log = logging.getLogger(__name__)

_loads = orjson.loads
RECEIPTS_GROUP_BYTES = RECEIPTS_GROUP.encode()
DEFAULT_CONSUMER = "receipts"  # stable: finds what an older worker of this name left pending
_MAX_SHAPES = 1024  # distinct field-name tuples remembered (engine events have a handful)


def _order(entry_id: bytes) -> int:
    """An entry id as one sortable int, ordered as :func:`lifecycle.archive.id_order`:
    both halves are 64-bit, so ``ms << 64 | seq`` orders as the pair does."""
    ms, _, seq = entry_id.partition(b"-")
    return int(ms) << 64 | int(seq or 0)


def _decode(fields: list[bytes]) -> dict[str, Any]:
    """The entry's fields decoded per the wire format; a value that is not JSON is text."""
    mapping = dict(zip(fields[0::2], fields[1::2], strict=True))
    try:  # the wire format's common case, at a third of decode_lenient's cost
        return {name.decode(): _loads(value) for name, value in mapping.items()}
    except (orjson.JSONDecodeError, UnicodeDecodeError):
        return decode_lenient(mapping)  # NaN, huge ints, raw text: kept as text


def _shape(names: tuple[bytes, ...]) -> tuple[list[bytes], int | None, int | None] | None:
    """For one tuple of field names: the JSON keys with their separators
    (``{"kind":``, ``,"workflow":``, ...) and where ``kind`` and ``graph`` are;
    None if a name is not UTF-8 or is repeated (those entries take the decoding path)."""
    try:
        texts = [name.decode() for name in names]
    except UnicodeDecodeError:
        return None
    if len(set(texts)) != len(texts):
        return None
    keys = [b"," + orjson.dumps(text) + b":" for text in texts]
    keys[0] = b"{" + keys[0][1:]
    kind_at = texts.index("kind") if "kind" in texts else None
    graph_at = texts.index("graph") if "graph" in texts else None
    return keys, kind_at, graph_at


@dataclass
class ReceiptsStats:
    archived: int = 0  # entries written
    skipped: int = 0  # entries an older worker left pending that the archive holds already
    gone: int = 0  # entries an older worker left pending, deleted before they were archived
    batches: int = 0
    trimmed: int = 0
    peak_lengths: dict[str, int] = field(default_factory=dict)  # XLEN seen before each trim


class ReceiptsWorker:
    """Archive the engine's streams into ``sink``. ``run()`` until ``stop()`` or a signal."""

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
        trim_every: float | None = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.sink = sink
        self.keys = keys or Keys()
        self.consumer = consumer
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.rescan_every = rescan_every
        self.trim_every = trim_every
        self.clock = clock
        self.stats = ReceiptsStats()
        self.streams: list[str] = []
        self._last = sink.last_ids()
        self._positions: dict[str, str] = {}  # stream -> the id XREAD reads after
        # A sink that takes an entry's event as JSON bytes (orjson.Fragment) gets it so.
        self._fragments = getattr(sink, "json_fragments", False) is True
        self._shapes: dict[tuple[bytes, ...], Any] = {}  # field names -> _shape(), or ()
        self._stopping = threading.Event()
        self._signals = 0

    # -- control -------------------------------------------------------------------
    def stop(self) -> None:
        """Finish the batch in hand, then return from ``run()``; idempotent, thread-safe."""
        self._stopping.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: stop after the batch in hand; a second one exits at once."""

        def handler(signum: int, _frame: Any) -> None:
            self._signals += 1
            if self._signals > 1:
                raise SystemExit(128 + signum)
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self, idle_timeout: float | None = None) -> ReceiptsStats:
        """Archive until stopped (or until nothing arrived for ``idle_timeout`` seconds)."""
        next_rescan = next_trim = 0.0
        last_entry = self.clock()
        while not self._stopping.is_set():
            try:
                now = self.clock()
                if now >= next_rescan:
                    self._discover()
                    next_rescan = now + self.rescan_every
                if self.trim_every is not None and now >= next_trim:
                    self._trim()
                    next_trim = now + self.trim_every
                if self._read(self.block_ms):
                    last_entry = self.clock()
                elif idle_timeout is not None and self.clock() - last_entry >= idle_timeout:
                    break
            except redis.ConnectionError as error:
                # Redis away: reading resumes from the archive's last ids once the
                # streams are joined again.
                log.warning("receipts: Redis unavailable (%s); retrying in 1s", error)
                self.streams = []
                self._stopping.wait(1.0)
                next_rescan = 0.0
        self.sink.flush()
        return self.stats

    # -- steps ---------------------------------------------------------------------
    def _discover(self) -> None:
        """Join every engine stream not joined yet: archive what an older worker left
        pending in the group, then read on from the archive's last id (or the group's,
        if further: an archive started after the group sees what comes next)."""
        keys = self.keys
        bases = [keys.lifecycle] + sorted(
            keys.tasks(kind.decode()) for kind in self.client.smembers(keys.kinds)
        )
        wanted = [s for base in bases for s in (base, dead_letter_key(base))]
        new = []
        for stream in wanted:
            if stream in self.streams:
                continue
            dead = stream.endswith(":dead")
            if dead and not self.client.exists(stream):
                continue  # created by the first dead letter; joined at a later rescan
            try:
                # Id 0: the group sees everything the stream still holds, from before our start.
                self.client.xgroup_create(stream, RECEIPTS_GROUP, id="0", mkstream=not dead)
            except redis.ResponseError as error:
                if "BUSYGROUP" not in str(error):
                    raise
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
        """One XREAD of every stream from its position; archive, then move the group.
        Returns the number of entries read."""
        streams = self.streams
        if not streams:
            return 0
        positions = self._positions
        command: list[str | int] = ["XREAD", "COUNT", self.batch_size]
        if block_ms is not None:
            command += ["BLOCK", block_ms]
        command += ["STREAMS", *streams, *[positions[s] for s in streams]]
        read = self._archive(self._reply(command))
        if not read:
            return 0
        last = {stream: entries[-1][0].decode() for stream, entries in read.items()}
        positions.update(last)
        self._send(
            [("XGROUP", "SETID", stream, RECEIPTS_GROUP, id_) for stream, id_ in last.items()]
        )
        return sum(map(len, read.values()))

    def _read_pending(self, stream: str) -> int:
        """Entries this consumer holds pending in the group (left by an older worker):
        archive those not archived yet, acknowledge all. Returns how many were read."""
        command = ["XREADGROUP", "GROUP", RECEIPTS_GROUP, self.consumer]
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
        batch: list[dict[str, Any]] = []
        archived = 0
        fragments = self._fragments
        # The last ids of this batch become "archived" only once the sink has flushed:
        # an error before that (a Redis call in _add_graph, the disk) must leave the
        # entries to be read and archived again, not skipped as already archived.
        read: dict[str, list[Any]] = {}
        written: dict[str, str] = {}
        for name, entries in reply.items() if isinstance(reply, dict) else reply:
            if not entries:
                continue
            stream = name.decode()
            read[stream] = entries
            last = self._last.get(stream)
            start = 0
            if last is not None:  # ids grow: only a prefix can have been archived already
                last_order = _order(last.encode())
                while start < len(entries) and _order(entries[start][0]) <= last_order:
                    start += 1
                self.stats.skipped += start
            if start < len(entries):
                written[stream] = entries[-1][0].decode()
            for raw_id, fields in entries[start:] if start else entries:
                entry_id = raw_id.decode()
                archived += 1
                if not fields:  # deleted before we read it: say so rather than hide the gap
                    batch.append({"stream": stream, "id": entry_id, "gone": True})
                    self.stats.gone += 1
                    continue
                encoded = self._encoded(fields) if fragments else None
                event: Any
                if encoded is not None:
                    event, start_workflow, digest = encoded
                else:
                    event = _decode(fields)
                    start_workflow = event.get("kind") == START_WORKFLOW
                    digest = event.get("graph") if start_workflow else None
                if start_workflow:
                    self._add_graph(digest, batch)
                batch.append({"stream": stream, "id": entry_id, "event": event})
        if batch:
            self.sink.write(batch)
            self.sink.flush()  # durable before the group moves: the whole guarantee
            self.stats.archived += archived
            self._last.update(written)
        if read:
            self.stats.batches += 1
        return read

    def _encoded(self, fields: list[bytes]) -> tuple[orjson.Fragment, bool, Any] | None:
        """The event's JSON object built from the entry's own JSON values, not decoded and
        encoded again: ``(fragment, is start-workflow, its graph)``. None when the entry
        is not plain (a value that is not JSON on its own, a field name that is not UTF-8
        or repeated, a line break or carriage return as whitespace): :func:`_decode`
        then archives it as before.

        Every value is parsed on its own, exactly as the decoding path does, so the
        archived line parses to the same event; only the bytes may differ from a
        re-encoding (the writer's own number spelling and escapes are kept).
        """
        names = tuple(fields[0::2])
        shape = self._shapes.get(names)
        if shape is None:
            if len(self._shapes) >= _MAX_SHAPES:
                self._shapes.clear()
            shape = self._shapes[names] = _shape(names) or ()  # (): known not plain
        if not shape:
            return None
        keys, kind_at, graph_at = shape
        values = fields[1::2]
        try:
            parsed = list(map(_loads, values))
        except orjson.JSONDecodeError:
            return None
        fields[0::2] = keys
        fields.append(b"}")
        text = b"".join(fields)
        if b"\n" in text or b"\r" in text:  # JSON whitespace only, yet they would end the line
            fields.pop()
            fields[0::2] = names
            return None
        start = kind_at is not None and parsed[kind_at] == START_WORKFLOW
        graph = parsed[graph_at] if start and graph_at is not None else None
        return orjson.Fragment(text), start, graph

    def _add_graph(self, digest: Any, batch: list[dict[str, Any]]) -> None:
        """Archive the compiled graph a start-workflow names, the first time it is named:
        replay needs it, and it lives in a Redis key, not in any stream."""
        if not isinstance(digest, str) or self.sink.has_graph(digest):
            return
        if any(r.get("graph") == digest for r in batch):
            return
        text = self.client.get(self.keys.graph(digest))
        if text is not None:
            batch.append({"graph": digest, "text": text.decode()})

    def _trim(self) -> None:
        """Trim lifecycle and task streams to what every group has acknowledged.

        Only streams whose engine group exists: with the receipts group alone on a
        task stream, trimming would drop start-tasks no task worker has seen yet.
        Dead-letter streams are left for operators (they are archived all the same).
        """
        for stream in self.streams:
            if stream.endswith(":dead"):
                continue
            engine_group = LIFECYCLE_GROUP if stream == self.keys.lifecycle else TASK_GROUP
            groups = {g["name"].decode() for g in self.client.xinfo_groups(stream)}
            if engine_group not in groups:
                continue
            length = int(self.client.xlen(stream))
            peak = self.stats.peak_lengths
            peak[stream] = max(peak.get(stream, 0), length)
            self.stats.trimmed += trim_acknowledged(self.client, stream).removed
