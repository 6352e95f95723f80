"""wait:event — watch the lifecycle stream for the events that registered waits expect.

:class:`EventWatcher` reads ``{flow}:lifecycle`` through its own consumer group
(``wait``), so it sees every event once per deployment whatever else reads the
stream. For each batch it fetches, in one round trip, the waits registered
for the kinds in the batch (``{flow}:wait:event:<kind>``), and ends each wait
whose ``match`` fields the event carries, with ``wait_complete.lua``.

Only events written after the wait's start-task count: a wait records the
start-task's entry id (``since``) and events with smaller ids are skipped,
so a new group reading old history, or a watcher catching up after an
outage, never ends a wait with an event from before it began. (Both ids come
from the one Redis server's clock.)

Crash safety: a batch is acknowledged after its completions; if the watcher
dies in between, the batch is read again and the completions find their
records gone (``wait_complete.lua`` answers 0): nothing is sent twice.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from lifecycle.keys import WAIT_EVENTS_GROUP, Keys
from rqse import EventListener
from workers.scripts import load_script

__all__ = ["EventWatcher", "entry_order"]

log = logging.getLogger(__name__)


def entry_order(entry_id: str) -> tuple[int, int]:
    """``"1714564800000-3"`` -> ``(1714564800000, 3)``, for comparing ids of two streams."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def matches(match: dict[str, Any] | None, event: dict[str, Any]) -> bool:
    """Does ``event`` carry every field of ``match`` with an equal value? None: any event."""
    if not match:
        return True
    missing = object()
    return all(event.get(name, missing) == value for name, value in match.items())


class EventWatcher(EventListener):
    """Ends registered wait:event tasks when their event appears on the lifecycle stream."""

    def __init__(self, keys: Keys | None = None, **options: Any) -> None:
        self.keys = keys or Keys()
        options.setdefault("batch_size", 200)
        options.setdefault("claim_idle", 10.0)
        super().__init__(self.keys.lifecycle, WAIT_EVENTS_GROUP, **options)
        self._complete = load_script(self.connection, "wait_complete")
        self.ended = 0  # waits this watcher ended

    def process_batch(self, batch: list[tuple[str, dict[str, Any]]]) -> list[str]:
        kinds = sorted({str(event.get("kind")) for _, event in batch})
        pipe = self.connection.pipeline(transaction=False)
        for kind in kinds:
            pipe.hgetall(self.keys.wait_events(kind))
        registered = {
            kind: [(tid.decode(), orjson.loads(raw)) for tid, raw in waits.items()]
            for kind, waits in zip(kinds, pipe.execute(), strict=True)
            if waits
        }
        if not registered:
            return []
        done: set[str] = set()
        calls = []
        for event_id, event in batch:
            kind = str(event.get("kind"))
            for task_id, wait in registered.get(kind, ()):
                if task_id in done or entry_order(event_id) <= entry_order(wait["since"]):
                    continue
                if not matches(wait.get("match"), event):
                    continue
                done.add(task_id)
                output = orjson.dumps(event["output"]) if "output" in event else b""
                receipt = event_id if wait.get("receipt", True) else ""
                calls.append((task_id, kind, output, receipt))
        if calls:
            pipe = self.connection.pipeline(transaction=False)
            for task_id, kind, output, receipt in calls:
                self._complete(
                    keys=[self.keys.waits, self.keys.lifecycle, self.keys.wait_events(kind)],
                    args=[task_id, output, receipt],
                    client=pipe,
                )
            ended = sum(int(n) for n in pipe.execute())
            self.ended += ended
            log.info("wait:event: %d of %d matching waits ended", ended, len(calls))
        return []
