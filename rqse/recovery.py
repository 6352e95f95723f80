"""Recovery: entries already delivered that still need handling.

Two sources, both ahead of new entries:

* **own pending** (:meth:`Recovery._recover_own`): on establishing, the
  entries this consumer name still holds - from a previous run, or a batch
  whose acknowledgement was lost with the connection - read with XREADGROUP
  from id 0;
* **claims** (:meth:`Recovery._claim`): entries idle longer than ``claim_idle``
  on any consumer of the group (this one included: that is how a failed entry
  is retried), taken over with XAUTOCLAIM, one step per stream per turn.

Both read delivery counts with XPENDING (one pipeline per batch) so that the
batch handler can dead-letter entries delivered too often.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from time import monotonic
from typing import Any

import redis

from rqse.batch import BatchHandler
from rqse.events import stream_items
from rqse.weather import DOWN, TIMEOUT, classify, is_weather

__all__ = ["Recovery"]

logger = logging.getLogger(__name__)

_PENDING_PAGE = 1000
_CLOCK_SLACK_MS = 2


class Recovery(BatchHandler):
    """Mixin of :class:`rqse.listener.EventListener`: the attributes below are its."""

    _streams: tuple[str, ...]
    _reader: redis.Redis | None
    _claim_idle: float
    _claim_cursors: dict[str, Any]
    _next_claim: float

    def _room(self) -> int:
        raise NotImplementedError

    def _recover_own(self, streams: Sequence[str] | None = None) -> None:
        """Re-process what this consumer held when it last stopped (or lost Redis), on
        ``streams`` (default: all of them)."""
        assert self._reader is not None
        self._give_back_lost_deliveries()
        for stream in self._streams if streams is None else streams:
            cursor: str | bytes = "0"
            while not self._stopping.is_set() and self._room() > 0:
                sent = monotonic()
                try:
                    reply = self._reader.xreadgroup(
                        self._group, self._consumer, {stream: cursor}, count=self._room()
                    )
                except Exception as error:
                    self._delivery_lost(sent, error)
                    raise
                entries = next((e for _, e in stream_items(reply)), None)
                if not entries:
                    break
                self.stats.recovered += len(entries)
                self._handle(stream, entries, self._counted(stream, entries))
                cursor = entries[-1][0]

    def _claim(self) -> None:
        """One XAUTOCLAIM step per stream; scans again soon until every cursor wraps."""
        self.stats.claim_scans += 1
        wrapped = True
        idle_ms = int(self._claim_idle * 1000)
        for stream in self._streams:
            room = self._room()
            if room <= 0:
                return
            sent = monotonic()
            try:
                reply = self._redis.xautoclaim(
                    stream,
                    self._group,
                    self._consumer,
                    idle_ms,
                    start_id=self._claim_cursors[stream],
                    count=room,
                )
            except Exception as error:
                self._delivery_lost(sent, error)
                raise
            cursor, entries = reply[0], reply[1]
            self._claim_cursors[stream] = cursor
            if cursor not in (b"0-0", "0-0"):
                wrapped = False
            if entries:
                self.stats.claimed += len(entries)
                logger.info(
                    "consumer %s: claimed %d entries of %s idle over %.1fs",
                    self._consumer,
                    len(entries),
                    stream,
                    self._claim_idle,
                )
                self._handle(stream, entries, self._counted(stream, entries))
        now = monotonic()
        self._next_claim = now + self._claim_idle / 2 if wrapped else now

    def _delivery_lost(self, sent: float, error: BaseException) -> None:
        """A read or claim sent at ``sent`` failed with ``error``: when its reply was lost
        (the connection dropped, or the server held it back past the timeout), it may
        have delivered entries whose ids never came: the next recovery finds them. (A
        refusal, BUSY or OOM, is a reply: the command did not run.)"""
        if self._lost_delivery is None and classify(error) in (DOWN, TIMEOUT):
            self._lost_delivery = sent
            # Delivered just before, within the clock's slack: counted failures.
            self._not_lost.update(self._failed_lately)

    def _give_back_lost_deliveries(self) -> None:
        """Give back the delivery of each entry this consumer holds that was delivered
        since a lost reply's round trip was sent (XPENDING's idle times, by pages): the
        reply never came, so nothing was handled."""
        sent = self._lost_delivery
        if sent is None:
            return
        lost: list[tuple[str, dict[bytes, int]]] = []
        not_lost = self._not_lost
        for stream in self._streams:
            start: bytes | str = "-"
            counts: dict[bytes, int] = {}
            while True:
                page: list[dict[str, Any]] = self._redis.xpending_range(
                    stream, self._group, start, "+", _PENDING_PAGE, consumername=self._consumer
                )
                # Server milliseconds since each delivery against local ones since the
                # send, taken once the page is here: a delivery after the send is idle for
                # less, give or take the server's whole milliseconds.
                since_ms = (monotonic() - sent) * 1000 + _CLOCK_SLACK_MS
                for pending in page:
                    entry_id = pending["message_id"]
                    if pending["time_since_delivered"] <= since_ms and (
                        (stream, entry_id) not in not_lost
                    ):
                        counts[entry_id] = pending["times_delivered"]
                if len(page) < _PENDING_PAGE:
                    break
                start = b"(" + page[-1]["message_id"]
            lost.append((stream, counts))
        self._lost_delivery = None
        not_lost.clear()
        for stream, counts in lost:
            if counts:
                self._give_back(stream, [(i, {}) for i in counts], (), counts)

    def _counted(self, stream: str, entries: Sequence[tuple[bytes, Any]]) -> dict[bytes, int]:
        """The delivery counts of ``entries`` just delivered; when Redis weather keeps
        them unknown, the delivery just made is noted as the weather's (it cannot be
        given back in Redis without knowing what to set the count to)."""
        try:
            return self._delivery_counts(stream, entries)
        except Exception as error:
            if is_weather(error):
                self._note_weathered(stream, [entry_id for entry_id, _ in entries])
            raise

    def _delivery_counts(
        self, stream: str, entries: Sequence[tuple[bytes, Any]]
    ) -> dict[bytes, int]:
        """Times each entry was delivered (XPENDING per id, one pipeline)."""
        pipe = self._redis.pipeline(transaction=False)
        for entry_id, _ in entries:
            pipe.xpending_range(stream, self._group, entry_id, entry_id, 1)
        counts = {}
        for (entry_id, _), pending in zip(entries, pipe.execute(), strict=True):
            counts[entry_id] = pending[0]["times_delivered"] if pending else 1
        return counts
