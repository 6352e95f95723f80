"""The receipts worker: archive every entry of every engine stream, exactly once, then ack.

It reads ``{flow}:lifecycle``, every ``{flow}:tasks:<kind>`` (kinds from
``{flow}:kinds``, rescanned while running) and their ``:dead`` streams through
its own consumer group, writes each entry to a :class:`lifecycle.archive.Sink`,
flushes (fsync) and only then acknowledges. Exactly once across crashes:

* at least once, because nothing is acknowledged before it is durable in the
  archive: a SIGKILL leaves the batch pending, and a restart re-reads pending
  entries (its own, and any other consumer's, claimed at start) before new ones;
* at most once, because the sink knows the last id archived per stream, and
  a stream delivers its entries to one consumer in id order: an entry at or
  below that id was archived before the crash and is acknowledged unwritten.

That argument needs one receipts worker per archive and partition; the
archive directory's lock enforces the first half. The worker also trims the
engine streams with rqse's ``trim_acknowledged`` (only entries every group,
this one included, has acknowledged), so streams stay bounded.
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
from rqse.events import decode_lenient, stream_items
from rqse.keys import dead_letter_key
from rqse.trim import trim_acknowledged

__all__ = ["ReceiptsStats", "ReceiptsWorker"]

log = logging.getLogger(__name__)

_loads = orjson.loads
DEFAULT_CONSUMER = "receipts"  # stable: a restart finds its own pending entries


@dataclass
class ReceiptsStats:
    archived: int = 0  # entries written
    skipped: int = 0  # redelivered entries already in the archive
    gone: int = 0  # entries deleted before they could be read
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
                if self._read(">", self.block_ms):
                    last_entry = self.clock()
                elif idle_timeout is not None and self.clock() - last_entry >= idle_timeout:
                    break
            except redis.ConnectionError as error:
                # Redis away: whatever was not acknowledged stays pending and is re-read
                # (and skipped if already archived) once the streams are established again.
                log.warning("receipts: Redis unavailable (%s); retrying in 1s", error)
                self.streams = []
                self._stopping.wait(1.0)
                next_rescan = 0.0
        self.sink.flush()
        return self.stats

    # -- steps ---------------------------------------------------------------------
    def _discover(self) -> None:
        """Join every engine stream not joined yet, then archive what it holds pending."""
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
        self.streams.extend(new)
        for stream in new:  # own pending first: they are older than anything '>' returns
            while self._read("0", None, [stream]):
                pass

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

    def _read(self, start: str, block_ms: int | None, streams: list[str] | None = None) -> int:
        """One XREADGROUP from ``start`` (``>`` new, ``0`` own pending); archive and ack.
        Returns the number of entries handled."""
        streams = streams or self.streams
        if not streams:
            return 0
        reply = self.client.xreadgroup(
            RECEIPTS_GROUP,
            self.consumer,
            dict.fromkeys(streams, start),
            count=self.batch_size,
            block=block_ms,
        )
        batch: list[dict[str, Any]] = []
        acks: dict[str, list[bytes]] = {}
        # The last ids of this batch become "archived" only once the sink has flushed:
        # an error before that (a Redis call in _add_graph, the disk) must leave the
        # entries to be read and archived again, not skipped as already archived.
        seen: dict[str, str] = {}
        for name, entries in stream_items(reply):
            stream = name.decode()
            last = self._last.get(stream)
            last_order = id_order(last) if last else (-1, -1)
            for raw_id, fields in entries:
                acks.setdefault(stream, []).append(raw_id)
                entry_id = raw_id.decode()
                if id_order(entry_id) <= last_order:
                    self.stats.skipped += 1
                    continue
                last_order = id_order(entry_id)
                seen[stream] = entry_id
                if not fields:  # deleted before we read it: say so rather than hide the gap
                    batch.append({"stream": stream, "id": entry_id, "gone": True})
                    self.stats.gone += 1
                    continue
                try:  # the wire format's common case, at a third of decode_lenient's cost
                    event = {name.decode(): _loads(value) for name, value in fields.items()}
                except (orjson.JSONDecodeError, UnicodeDecodeError):
                    event = decode_lenient(fields)  # NaN, huge ints, raw text: kept as text
                if event.get("kind") == START_WORKFLOW:
                    self._add_graph(event.get("graph"), batch)
                batch.append({"stream": stream, "id": entry_id, "event": event})
        if not acks:
            return 0
        if batch:
            self.sink.write(batch)
            self.sink.flush()  # durable before acknowledged: the whole guarantee
            self.stats.archived += sum(1 for r in batch if "stream" in r)
        self._last.update(seen)
        pipe = self.client.pipeline(transaction=False)
        for stream, ids in acks.items():
            pipe.xack(stream, RECEIPTS_GROUP, *ids)
        pipe.execute()
        self.stats.batches += 1
        return sum(len(ids) for ids in acks.values())

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
