"""The lifecycle worker: reads the lifecycle stream, advances workflows, fires timers
and schedules, removes the workflows whose retention is over.

Several may run against one Redis: they share the ``lifecycle`` consumer
group, so each event is delivered to one of them, and the advance's WATCH (or its
script's version check) makes concurrent transitions of one workflow safe. A worker
killed at any point leaves its events pending; another claims them after
``claim_idle`` and, because a transition commits together with the
acknowledgement of its events, each takes effect exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from time import perf_counter
from typing import Any

import orjson

from flowlang.limits import DEFAULT_LIMITS, Limits, limits_changed
from lifecycle import events as ev
from lifecycle.engine.advance import Advancer
from lifecycle.engine.dead_tasks import DeadTasks, DeadTasksThread
from lifecycle.engine.retention import (
    DEFAULT_KEEP_DETAILS,
    DEFAULT_RETENTION,
    parse_duration,
    retention_pump,
)
from lifecycle.engine.schedules import SchedulePump
from lifecycle.engine.timers import timer_pump
from lifecycle.keys import Keys
from rqse import EventListener

__all__ = ["LifecycleWorker"]

log = logging.getLogger(__name__)


class LifecycleWorker(EventListener):
    """``EventListener`` on the lifecycle stream that handles whole batches at once."""

    #: Observes the advancer's seconds per batch when set (``--metrics-port``: a
    #: prometheus_client Histogram); None costs nothing.
    advance_seconds: Any = None

    def __init__(
        self,
        keys: Keys | None = None,
        *,
        timers: bool = True,
        schedules: bool = True,
        dead_tasks: bool = True,
        untokened_answers: bool = False,
        pack_starts: bool | Collection[str] = False,
        limits: Limits = DEFAULT_LIMITS,
        retain: float = parse_duration(DEFAULT_RETENTION),
        keep_details: float = parse_duration(DEFAULT_KEEP_DETAILS),
        **options: Any,
    ) -> None:
        """``retain``: seconds a workflow that ended stays in Redis (0: until deleted).
        ``keep_details``: seconds a finished workflow keeps its task records (0: none).
        ``pack_starts``: the kinds whose start-tasks go packed (True: every kind but the
        built-in ``wait`` and ``resource``; see :class:`lifecycle.engine.advance.Advancer`)."""
        self.keys = keys or Keys()
        options.setdefault("batch_size", 200)
        options.setdefault("claim_idle", 10.0)
        # Every kind reaches the advancer, not just LIFECYCLE_INPUTS: it acknowledges the
        # others (end-workflow, ...) inside its own transaction instead of the listener
        # spending a round trip per batch on them. So they count as processed, not
        # ignored, and share their batch's fate: left pending when it fails.
        super().__init__(self.keys.lifecycle, self.keys.lifecycle_group, None, **options)
        self.advancer = Advancer(
            self.connection,
            self.keys,
            limits=limits,
            untokened_answers=untokened_answers,
            pack_starts=pack_starts,
            retain_ms=int(retain * 1000),
            keep_details_ms=int(keep_details * 1000),
        )
        self.timers = timer_pump(self.connection, self.keys) if timers else None
        # Schedules fire from every worker; fire_schedule.lua makes each fire time once.
        self.schedules = SchedulePump(self.connection, self.keys) if schedules else None
        # Always on: workflows a worker scheduled are compacted and removed on time.
        self.retention = retention_pump(self.connection, self.keys)
        # Dead-lettered start-tasks answered as failures (lifecycle.engine.dead_tasks).
        self.dead_tasks = (
            DeadTasksThread(
                DeadTasks(
                    self.keys,
                    pool=self.connection.connection_pool,
                    consumer=f"{self.consumer}-dead-tasks",
                    claim_idle=options["claim_idle"],
                    block_ms=options.get("block_ms", 1000),
                )
            )
            if dead_tasks
            else None
        )

    def onStart(self) -> None:  # noqa: N802 - rqse hook name
        self.connection.set(self.keys.retention, self.advancer.transition.retain_ms)
        # What replay and recover must compute with to start what this worker starts
        # (an iteration's window decides which items start when).
        limits = limits_changed(self.advancer.transition.limits)
        self.connection.set(self.keys.limits, orjson.dumps(limits))
        if self.timers is not None:
            self.timers.start()
        if self.schedules is not None:
            self.schedules.start()
        self.retention.start()
        if self.dead_tasks is not None:
            self.dead_tasks.start()

    def onStop(self) -> None:  # noqa: N802
        if self.timers is not None:
            self.timers.stop()
        if self.schedules is not None:
            self.schedules.stop()
        self.retention.stop()
        if self.dead_tasks is not None:
            self.dead_tasks.stop()

    def process_batch(self, batch: list[tuple[str, dict[str, Any]]]) -> list[str]:
        """Advance; return the ids the advance acknowledged with its commits."""
        acknowledged: list[str] = []
        for chunk in _chunks(batch):
            acknowledged += self._advance(chunk)
        return acknowledged

    def _advance(self, batch: list[tuple[str, dict[str, Any]]]) -> list[str]:
        histogram = self.advance_seconds
        if histogram is None:
            result = self.advancer.apply(batch)
        else:
            started = perf_counter()
            result = self.advancer.apply(batch)
            histogram.observe(perf_counter() - started)
        # An end-tasks entry whose answers were refused goes to the dead letters once,
        # with every reason (its other answers were applied: a requeue changes nothing
        # of theirs).
        reasons: dict[str, list[str]] = {}
        for event_id, reason in result.rejected:
            log.warning("lifecycle: rejected %s", reason)
            reasons.setdefault(event_id, []).append(reason)
        for event_id, said in reasons.items():
            self.reject(event_id, "; ".join(said))
        if result.conflicts:
            log.debug("lifecycle: %d recomputations after concurrent advances", result.conflicts)
        return result.acknowledged


# Answers advanced together at most. A batch is one WATCH of its workflows, whose cost
# in Redis grows with the square of their number (the server checks each key against
# those the connection already watches): a read of 200 end-tasks entries of 200 answers
# each, advanced at once, held the server for seconds. At 200, a WATCH costs 0.8 µs per
# answer against 1.4 at 400; the MULTI/EXEC per chunk this adds is 0.02 command per task.
_CHUNK_ANSWERS = 200


def _chunks(batch: list[tuple[str, dict[str, Any]]]) -> list[list[tuple[str, dict[str, Any]]]]:
    """``batch`` in runs of entries holding at most :data:`_CHUNK_ANSWERS` answers
    together (an end-tasks entry counts its answers; any other entry one)."""
    chunks: list[list[tuple[str, dict[str, Any]]]] = [[]]
    size = 0
    for entry in batch:
        answers = entry[1].get("answers") if entry[1].get("kind") == ev.END_TASKS else None
        count = len(answers) if type(answers) is list else 1
        if chunks[-1] and size + count > _CHUNK_ANSWERS:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += count
    return chunks
