"""Handling one batch of entries: the per-entry decisions of a listener.

First ``prepare_batch()`` sees the raw entries once (ids it returns are
acknowledged unseen). Then for each entry, in order: deleted while pending ->
acknowledge; set aside by ``prepare_batch()`` -> acknowledge; delivered
more than ``max_deliveries`` times -> dead letter; malformed -> dead letter;
kind not selected -> acknowledge (ignored), or dead letter with
``dead_letter_unselected`` (receipts excepted); else ``process()``: truthy ->
acknowledge (processed), falsy -> acknowledge (declined), exception -> stays
pending (failed), or dead letter on the last allowed delivery (InterruptedError
while stopping -> stays pending, its delivery given back). Then one
transaction writes it all (:class:`rqse.outbox.Outbox`).

Redis weather (:mod:`rqse.weather`: out of memory, read-only, unreachable...)
is not the entry's fault. When ``process()`` fails with it (and a probe finds
this listener's Redis refusing writes too: the handler may have met another
server), or ``prepare_batch()`` or ``finish_batch()`` does (on any server: it
is the batch's bookkeeping, not an entry's work; the second writes nothing of
the batch then), or the batch's transaction does, the batch
stops there (and with it the read's entries of other streams): nothing is
counted as failed, the entries not acknowledged stay pending, and each has
the delivery the weather cost it given back in Redis (``XCLAIM ... RETRYCOUNT``,
which Redis accepts even when it refuses writes for want of memory), so that
no consumer counts it toward ``max_deliveries``: nothing is dead-lettered
because Redis was full, however long the storm and whoever claims the entry
meanwhile. Where even that is refused (read-only, unreachable), or the counts
of entries just claimed could not be read, the delivery is noted in
``_weathered``: the entry's deliveries here count what is noted less, until a
give-back in Redis succeeds or the entry is acknowledged, which take the notes
with them. The error then goes up to the loop, which backs off. A stop gives
back the deliveries of the entry it interrupted and of those not started.

This is the hot path: locals instead of attribute lookups, no per-entry
allocation beyond the decoded event, the id string and the ack list slot (and,
after weather, a lookup of each claimed entry's note).
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import redis

from rqse.deadletter import (
    INVALID_JSON,
    MAX_DELIVERIES,
    PROCESS_ERROR,
    REJECTED,
    UNSELECTED,
    dead_letter_fields,
)
from rqse.errors import BatchWeather, MalformedEntry
from rqse.events import RECEIPT, decode_fields
from rqse.keys import dead_letter_key
from rqse.lease import Lease
from rqse.outbox import Outbox
from rqse.weather import OUT_OF_MEMORY, classify, is_weather

__all__ = ["BatchHandler", "ListenerStats"]

logger = logging.getLogger(__name__)

_MAX_NOTES = 100_000
# Within this of maxmemory, an out-of-memory error is this Redis's: a batch's writes
# (and their client buffers) need more than a probe does.
_OOM_MARGIN = 16 << 20

Entry = tuple[bytes, dict[bytes, bytes]]


@dataclass
class ListenerStats:
    """Counters of one listener (since construction)."""

    received: int = 0  # entries read, however they ended
    processed: int = 0  # process() returned truthy
    declined: int = 0  # process() returned falsy ("not mine")
    ignored: int = 0  # kind not in select, acknowledged unseen
    failed: int = 0  # process() raised (entry left pending or dead-lettered)
    dead_lettered: int = 0  # moved to the dead-letter stream
    recovered: int = 0  # own pending entries re-read at (re)establishment
    claimed: int = 0  # entries taken over by XAUTOCLAIM
    claim_scans: int = 0  # XAUTOCLAIM rounds
    reconnects: int = 0  # transient Redis errors survived

    @property
    def handled(self) -> int:
        """Entries finished: acknowledged or dead-lettered."""
        return self.processed + self.declined + self.ignored + self.dead_lettered

    def outcomes(self) -> tuple[int, int, int, int, int, int]:
        """received, processed, declined, ignored, failed, dead_lettered."""
        return (
            self.received,
            self.processed,
            self.declined,
            self.ignored,
            self.failed,
            self.dead_lettered,
        )

    def add_since(self, before: tuple[int, ...], now: ListenerStats) -> None:
        """Add what ``now`` counted since its :meth:`outcomes` were ``before``."""
        received, processed, declined, ignored, failed, dead = now.outcomes()
        self.received += received - before[0]
        self.processed += processed - before[1]
        self.declined += declined - before[2]
        self.ignored += ignored - before[3]
        self.failed += failed - before[4]
        self.dead_lettered += dead - before[5]


class BatchHandler:
    """Mixin of :class:`rqse.listener.EventListener`: the attributes below are its."""

    stats: ListenerStats
    _redis: redis.Redis
    _outbox: Outbox
    _lease: Lease
    _stopping: threading.Event
    _group: str
    _consumer: str
    _select: frozenset[str] | None
    _select_attribute: str
    _max_deliveries: int
    _max_entry_bytes: int
    _own_garbage: bool
    _unselected_to_dead_letters: bool
    _in_batch: bool
    _current_stream: str | None
    # (stream, entry id) -> deliveries lost to Redis weather, not yet made up for
    _weathered: dict[tuple[str, bytes], int]
    # When a round trip that delivers entries was sent whose reply weather lost
    # (monotonic), until the next recovery notes what it delivered; else None.
    _lost_delivery: float | None
    # Entries that look delivered since then but were not by that round trip (given
    # back meanwhile: their idle times reset; or delivered just before it).
    _not_lost: set[tuple[str, bytes]]
    _batch_noted: bool  # a batch met a note since the last flush
    _interrupted: list[Entry]  # the batch's entries a stop interrupted
    _failed_lately: list[tuple[str, bytes]]  # the last batch's entries failed (counted)
    # The batch whose writes wait in the outbox for the next read: (stream, entries,
    # delivery counts), or None.
    _deferred: tuple[str, Sequence[Entry], dict[bytes, int] | None] | None = None
    #: Counters per stream, kept only when set to a dict (rqse.metrics does): added up
    #: once per batch from ``stats``, so the hot path pays nothing per entry for them.
    stream_stats: dict[str, ListenerStats] | None = None

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        raise NotImplementedError

    def decode_entry(self, fields: dict[bytes, bytes], event_id: str) -> dict[str, Any]:
        """The event of one entry, as ``process`` will receive it; raises MalformedEntry.

        By default every field decoded per the wire format (``decode_fields``). A
        pass-through consumer may override it to keep values as their JSON bytes
        (what it returns must still map the select field to the event's kind).
        """
        return decode_fields(fields, event_id, self._select_attribute, self._max_entry_bytes)

    # A subclass that overrides process_batch() gets the whole batch of decoded,
    # selected events in one call instead of one process() call per event: for
    # consumers that group work across events (the lifecycle batches its Redis
    # round trips). Returning acknowledges them all — except the event ids it
    # returns, which it says it acknowledged itself (atomically with its own
    # writes); raising leaves them all pending, as a raising process() does;
    # reject() dead-letters one of them.
    process_batch: Any = None

    def prepare_batch(self, stream: str, entries: Sequence[Entry]) -> Collection[bytes] | None:
        """Called once per batch read from ``stream``, before any of its ``entries``
        (``(id, {field: raw value})``, as Redis gave them) is handled: to look something
        up for the whole batch in one round trip. The entry ids it returns are
        acknowledged without ``process()`` (counted as ignored). Raising leaves the
        whole batch pending: Redis weather is waited out as anywhere in the loop, any
        other exception ends ``listen()``, as a hook's does. For a read of new entries,
        ``read_replies`` holds the replies to the listener's ``read_along`` commands."""
        return None

    def finish_batch(self, stream: str) -> None:
        """Called once per batch after its last entry was handled (or the batch was cut
        short: a stop, Redis weather), before its writes are sent: what it emits goes in
        the batch's transaction. For what a whole batch shares, set up in
        ``prepare_batch`` (a lease taken for all its entries, released in one write)."""

    def reject(self, event_id: str, reason: str) -> None:
        """From process_batch(): move one event of the batch to the dead-letter stream."""
        entry_id, fields, deliveries = self._batch_entries[event_id]
        self._dead_letter(
            self._current_stream or "", entry_id, fields, REJECTED, reason, deliveries
        )
        self._rejected.add(event_id)

    def _handle(
        self,
        stream: str,
        entries: Sequence[Entry],
        counts: dict[bytes, int] | None,
        defer: bool = False,
    ) -> None:
        """Handle ``entries`` of ``stream`` and flush; ``counts`` are delivery counts
        (None: first delivery of every entry). ``defer``: leave the writes in the outbox
        (``_deferred``) for the listener to send with its next read, or alone before
        anything else it does."""
        try:
            set_aside = self.prepare_batch(stream, entries) or None
        except Exception as refused:
            # The batch's own bookkeeping (slots, stop records), never an entry's work:
            # weather met there, on whichever server, costs no entry a delivery.
            if is_weather(refused):
                self._give_back(stream, entries, (), counts)
            raise
        stats = self.stats
        per_stream = self.stream_stats
        before = stats.outcomes() if per_stream is not None else None
        stats.received += len(entries)
        acks = self._outbox.acks_for(stream)
        self._lease.hold(stream, entries)
        stopping = self._stopping
        select = self._select
        kind_field = self._select_attribute
        decode = self.decode_entry
        max_deliveries = self._max_deliveries
        process = self.process
        batch_mode = self.process_batch is not None
        batch: list[tuple[str, dict[str, Any]]] = []
        self._batch_entries: dict[str, tuple[bytes, dict[bytes, bytes], int]] = {}
        self._rejected: set[str] = set()
        weathered = self._weathered
        weather: Exception | None = None
        unrun: list[Entry] = []
        if self._interrupted:  # left by a batch that ended in an error: given back then
            self._interrupted = []
        if self._failed_lately:
            self._failed_lately = []
        self._in_batch = True
        self._current_stream = stream
        try:
            for entry_id, fields in entries:
                if stopping.is_set():
                    # The rest stays pending on this consumer, its delivery given back.
                    unrun = list(entries[_position(entries, entry_id) :])
                    break
                if not fields:  # deleted (XDEL) while pending: nothing left to do
                    acks.append(entry_id)
                    continue
                if set_aside is not None and entry_id in set_aside:
                    stats.ignored += 1
                    acks.append(entry_id)
                    continue
                if counts is None:
                    deliveries = 1
                else:
                    deliveries = counts.get(entry_id, 1)
                    if weathered:
                        noted = weathered.get((stream, entry_id), 0)
                        if noted:
                            deliveries = max(1, deliveries - noted)
                            self._batch_noted = True
                if deliveries > max_deliveries:
                    self._dead_letter(
                        stream,
                        entry_id,
                        fields,
                        MAX_DELIVERIES,
                        f"delivered {deliveries} times without an acknowledgement "
                        f"(max_deliveries={max_deliveries})",
                        deliveries,
                    )
                    acks.append(entry_id)
                    continue
                event_id = entry_id.decode()
                try:
                    event = decode(fields, event_id)
                except MalformedEntry as e:
                    if self._own_garbage:
                        self._dead_letter(stream, entry_id, fields, e.reason, str(e), deliveries)
                    else:  # the stream's owner dead-letters it
                        stats.ignored += 1
                    acks.append(entry_id)
                    continue
                except Exception as e:  # a decode_entry override tripping on garbage
                    error = f"{type(e).__name__} while decoding: {e}"
                    self._dead_letter(stream, entry_id, fields, INVALID_JSON, error, deliveries)
                    acks.append(entry_id)
                    continue
                if select is not None and event[kind_field] not in select:
                    # (a receipt is rqse's own, written to the stream of what it is for)
                    if self._unselected_to_dead_letters and event[kind_field] != RECEIPT:
                        self._dead_letter_unselected(stream, entry_id, fields, event, deliveries)
                    else:
                        stats.ignored += 1
                    acks.append(entry_id)
                    continue
                if batch_mode:
                    batch.append((event_id, event))
                    self._batch_entries[event_id] = (entry_id, fields, deliveries)
                    continue
                try:
                    handled = process(event_id, event)
                except Exception as e:
                    if is_weather(e) and self._our_weather(stream, e):
                        weather = e  # Redis refused, not the entry: stop the batch here
                        break
                    stats.failed += 1
                    if self._failed(stream, entry_id, fields, e, deliveries):
                        acks.append(entry_id)
                    continue
                acks.append(entry_id)
                if handled:
                    stats.processed += 1
                else:
                    stats.declined += 1
            if batch and weather is None:
                weather = self._handle_batch(stream, batch, acks)
            try:
                self.finish_batch(stream)
            except Exception as refused:
                if is_weather(refused):  # its writes may be missing: none go, none count
                    self._outbox.clear()
                    self._give_back(stream, entries, (), counts)
                raise
        finally:
            self._in_batch = False
            self._current_stream = None
            if per_stream is not None and before is not None:
                counted = per_stream.get(stream)
                if counted is None:
                    counted = per_stream[stream] = ListenerStats()
                counted.add_since(before, stats)
        stopped: list[Entry] = []
        if self._interrupted or unrun:
            stopped, self._interrupted = [*self._interrupted, *unrun], []
        if defer and weather is None and not stopped:
            self._deferred = (stream, entries, counts)  # the lease holds them meanwhile
            return
        self._flush(stream, entries, counts)  # (weather there gives back all, once)
        if weather is not None:
            self._give_back(stream, entries, acks, counts)
            raise weather
        if stopped:  # a stop's: given back once the batch's writes are in
            self._give_back(stream, stopped, (), counts)

    def _flush(
        self, stream: str, entries: Sequence[Entry], counts: dict[bytes, int] | None
    ) -> None:
        """Write the outbox of the batch ``entries`` in one transaction; Redis weather
        gives their deliveries back (nothing was written)."""
        noted = self._noted_acks()
        try:
            self._outbox.flush(self._redis, self._group)
        except Exception as e:
            if is_weather(e):
                self._give_back(stream, entries, (), counts)
            raise
        finally:
            self._lease.clear()
        self._drop_notes(noted)

    def _noted_acks(self) -> list[tuple[str, bytes]]:
        """The outbox's acknowledgements of entries with weather notes (whose notes go
        once the acknowledgements are written); looked for only after a batch that met
        a note."""
        weathered = self._weathered
        if not self._batch_noted:
            return []
        self._batch_noted = False
        acks = self._outbox.acks.items()
        return [(stream, i) for stream, ids in acks for i in ids if (stream, i) in weathered]

    def _drop_notes(self, keys: Sequence[tuple[str, bytes]]) -> None:
        for key in keys:
            self._weathered.pop(key, None)

    def _flush_deferred(self) -> None:
        """Write the writes a batch left for the next read, now."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self._flush(*deferred)

    def _our_weather(self, stream: str, error: BaseException) -> bool:
        """Whether this listener's Redis refuses writes now (one probe, on the failure
        path only): a handler's error may come from another Redis it talks to, which
        must not spare an entry from being counted and, in the end, dead-lettered;
        unless the handler says it was the batch's bookkeeping (:class:`BatchWeather`).

        The probe is the write establishing does (XGROUP CREATE, answered BUSYGROUP by
        a healthy server), so it meets the same refusals the batch's writes would. Out
        of memory is a level, not a state: a small probe passes where the batch's large
        writes did not, so for it the probe is how near the limit this Redis is.
        """
        if isinstance(error, BatchWeather):
            return True
        try:
            self._redis.xgroup_create(stream, self._group, id="0", mkstream=True)
        except redis.RedisError as refused:
            # Its own words only: raised while handling the handler's error, it has
            # that error for context.
            if classify(refused, chain=False) is not None:
                return True
            if not str(refused).startswith("BUSYGROUP"):
                return False
        if classify(error) != OUT_OF_MEMORY:
            return False
        try:
            memory = self._redis.info("memory")
        except redis.RedisError:
            return False
        limit = int(memory.get("maxmemory", 0))
        return bool(limit) and int(memory.get("used_memory", 0)) >= limit - _OOM_MARGIN

    def _give_back(
        self,
        stream: str,
        entries: Sequence[Entry],
        finished: Sequence[bytes],
        counts: dict[bytes, int] | None,
    ) -> None:
        """Give back the delivery the weather cost each entry left pending: in Redis,
        where every consumer sees it (XCLAIM ... RETRYCOUNT, which Redis takes even
        when it refuses writes that need memory), else in this listener's notes. So a
        storm of any length, with claims going round between consumers, dead-letters
        nothing."""
        done = set(finished)
        left = [entry_id for entry_id, _ in entries if entry_id not in done]
        weathered = self._weathered
        by_count: dict[int, list[Any]] = {}
        for entry_id in left:
            delivered = counts.get(entry_id, 1) if counts is not None else 1
            if weathered:  # deliveries already noted as the weather's are given back too
                delivered = max(1, delivered - weathered.get((stream, entry_id), 0))
            by_count.setdefault(delivered - 1, []).append(entry_id)
        try:
            pipe = self._redis.pipeline(transaction=False)
            for count, ids in by_count.items():
                pipe.xclaim(
                    stream, self._group, self._consumer, 0, ids, retrycount=count, justid=True
                )
            pipe.execute()
        except redis.RedisError as error:  # not even that: remember it here
            logger.debug("consumer %s: delivery counts kept locally: %s", self._consumer, error)
            self._note_weathered(stream, left)
            return
        for entry_id in left:  # Redis's count is right again
            weathered.pop((stream, entry_id), None)
        if self._lost_delivery is not None:  # the claim made them look delivered since
            self._not_lost.update((stream, entry_id) for entry_id in left)

    def _note_weathered(self, stream: str, entry_ids: Sequence[bytes]) -> None:
        """Note one delivery of each entry as the weather's, in this listener: its next
        delivery here counts one less."""
        weathered = self._weathered
        if len(weathered) > _MAX_NOTES:  # the oldest never came back (claimed elsewhere)
            for key in list(islice(weathered, _MAX_NOTES // 2)):
                del weathered[key]
        for entry_id in entry_ids:
            key = (stream, entry_id)
            weathered[key] = weathered.pop(key, 0) + 1  # last in line: noted last

    def _handle_batch(
        self, stream: str, batch: list[tuple[str, dict[str, Any]]], acks: list[bytes]
    ) -> Exception | None:
        """process_batch() on the batch; returns the weather error that stopped it."""
        entries = self._batch_entries
        try:
            acknowledged = self.process_batch(batch) or ()
        except Exception as error:
            if is_weather(error) and self._our_weather(stream, error):
                return error
            self.stats.failed += len(batch)
            for event_id, _ in batch:
                entry_id, fields, deliveries = entries[event_id]
                if self._failed(stream, entry_id, fields, error, deliveries):
                    acks.append(entry_id)
            return None
        skip = set(acknowledged) - self._rejected
        for event_id, _ in batch:
            if event_id not in skip:
                acks.append(entries[event_id][0])
        self.stats.processed += len(batch) - len(self._rejected)
        return None

    def _failed(
        self,
        stream: str,
        entry_id: bytes,
        fields: dict[bytes, bytes],
        error: Exception,
        deliveries: int,
    ) -> bool:
        """Log a failure; dead-letter on the last delivery (True: acknowledge it), but
        for a handler interrupted by stop(), whose delivery is given back."""
        last = deliveries >= self._max_deliveries
        # A handler cut short by stop() (EventListener.sleep returned True) leaves the
        # entry for another consumer: expected at every shutdown, so no traceback.
        expected = isinstance(error, InterruptedError) and self._stopping.is_set()
        logger.log(
            logging.DEBUG if expected else logging.WARNING,
            "consumer %s: %s %s: process() failed on delivery %d of %d%s",
            self._consumer,
            stream,
            entry_id.decode(),
            deliveries,
            self._max_deliveries,
            "" if last and not expected else "; retried after claim_idle",
            exc_info=True,
        )
        if expected:  # stop()'s doing, not the entry's: its delivery is given back
            self._interrupted.append((entry_id, fields))
        else:  # counted: a read lost just after must not take it for its delivery
            self._failed_lately.append((stream, entry_id))
        if expected or not last:
            self._lease.release(entry_id)  # let it go idle, to be claimed again
            return False
        self._dead_letter(
            stream,
            entry_id,
            fields,
            PROCESS_ERROR,
            f"{type(error).__name__}: {error}",
            deliveries,
            "".join(traceback.format_exception(error)),
        )
        return True

    def _dead_letter_unselected(
        self,
        stream: str,
        entry_id: bytes,
        fields: dict[bytes, bytes],
        event: dict[str, Any],
        deliveries: int,
    ) -> None:
        """An entry of a kind outside ``select`` on a stream only those kinds (and rqse's
        receipts) belong on."""
        kind = repr(event[self._select_attribute])
        if len(kind) > 120:
            kind = kind[:117] + "..."
        selected = ", ".join(sorted(self._select or ()))
        error = f"kind {kind} is not one this consumer processes ({selected})"
        self._dead_letter(stream, entry_id, fields, UNSELECTED, error, deliveries)

    def _dead_letter(
        self,
        stream: str,
        entry_id: bytes,
        fields: dict[bytes, bytes],
        reason: str,
        error: str,
        deliveries: int,
        trace: str | None = None,
    ) -> None:
        target = dead_letter_key(stream)
        self._outbox.add(
            target,
            dead_letter_fields(
                stream=stream,
                group=self._group,
                consumer=self._consumer,
                entry_id=entry_id.decode(),
                fields=fields,
                reason=reason,
                error=error,
                deliveries=deliveries,
                traceback=trace,
            ),
            {},
        )
        self.stats.dead_lettered += 1
        logger.warning(
            "consumer %s: %s %s moved to %s (%s): %s",
            self._consumer,
            stream,
            entry_id.decode(),
            target,
            reason,
            error,
        )


def _position(entries: Sequence[Entry], entry_id: bytes) -> int:
    """Where ``entry_id`` is in ``entries`` (a stop's cut: not on the hot path)."""
    return next(n for n, (found, _) in enumerate(entries) if found == entry_id)
