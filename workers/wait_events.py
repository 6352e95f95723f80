"""wait:event — watch the lifecycle stream for the events that registered waits expect.

:class:`EventWatcher` reads ``{flow}:lifecycle`` through its own consumer group
(``wait``), so it sees every event once per deployment whatever else reads the
stream. For each batch it fetches, in one round trip, the waits registered
for the kinds in the batch (``{flow}:wait:event:<kind>``), and ends each wait
whose ``match`` fields the event carries, with ``wait_complete.lua``.

Who may end a wait: an event reaches a wait only when it is addressed to it —
its ``workflow`` field is the waiting workflow's id, or the wait names a
``channel`` (a parameter of the ``wait:event`` node) and the event's
``channel`` field is that name. An event with neither never ends a wait;
``match`` then narrows among the events addressed to the wait. So workflow B
cannot read what is sent to workflow A (its outputs, its end-tasks), whatever
B's ``match`` says; a channel is a name both sides agree on, and any
workflow whose flow names it receives what is sent to it.

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
import redis

from flowlang.limits import LimitExceeded
from lifecycle.keys import WAIT_EVENTS_GROUP, Keys
from rqse import EventListener
from rqse.events import decode_lenient
from workers.scripts import load_script
from workers.task import encode_output

__all__ = [
    "EventWatcher",
    "addressed_to",
    "catch_up",
    "end_waits",
    "entry_order",
    "json_equal",
    "matches",
]

log = logging.getLogger(__name__)


def entry_order(entry_id: str) -> tuple[int, int]:
    """``"1714564800000-3"`` -> ``(1714564800000, 3)``, for comparing ids of two streams."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def matches(match: dict[str, Any] | None, event: dict[str, Any]) -> bool:
    """Does ``event`` carry every field of ``match`` with an equal JSON value? None: any."""
    if not match:
        return True
    return all(name in event and json_equal(event[name], value) for name, value in match.items())


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: ``true`` is not ``1``, ``1`` is ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(json_equal, a, b))
    return type(a) is type(b) and a == b


def addressed_to(event: dict[str, Any], task_id: str, wait: dict[str, Any]) -> bool:
    """Whether ``event`` is for this wait: it names the waiting workflow, or the wait's
    channel. (Waits registered before ``workflow`` was recorded: the task id's.)"""
    workflow = wait.get("workflow")
    if workflow is None:
        workflow = task_id.rsplit("/", 2)[0]
    if event.get("workflow") == workflow and type(workflow) is str:
        return True
    channel = wait.get("channel")
    return channel is not None and event.get("channel") == channel and type(channel) is str


def counts_for(event_id: str, wait: dict[str, Any]) -> bool:
    """An event counts for a wait from the millisecond its start-task was written on.
    Ids of two streams share the clock, not the sequence: compare milliseconds only."""
    return entry_order(event_id)[0] >= entry_order(wait["since"])[0]


def end_waits(
    connection: redis.Redis,
    keys: Keys,
    complete: Any,
    batch: list[tuple[str, dict[str, Any]]],
    registered: dict[str, list[tuple[str, dict[str, Any]]]],
) -> tuple[int, int]:
    """End every registered wait that an event of ``batch`` satisfies (each once:
    wait_complete.lua decides). Returns (ended, matched)."""
    done: set[str] = set()
    calls = []
    for event_id, event in batch:
        kind = str(event.get("kind"))
        for task_id, wait in registered.get(kind, ()):
            if task_id in done or not counts_for(event_id, wait):
                continue
            if not addressed_to(event, task_id, wait):
                continue
            if not matches(wait.get("match"), event):
                continue
            done.add(task_id)
            output, error = b"", ""
            if "output" in event:
                # Anyone may write to the lifecycle stream: an output that the engine
                # would refuse fails this wait, not the watcher's batch.
                try:
                    output = encode_output(event["output"])
                except LimitExceeded as refused:
                    error = f"event {event_id} ({kind}): {refused}"
            receipt = event_id if wait.get("receipt", True) else ""
            calls.append((task_id, kind, output, receipt, error))
    if not calls:
        return 0, 0
    pipe = connection.pipeline(transaction=False)
    for task_id, kind, output, receipt, error in calls:
        complete(
            keys=[keys.waits, keys.lifecycle, keys.wait_events(kind)],
            args=[task_id, output, receipt, error],
            client=pipe,
        )
    return sum(int(n) for n in pipe.execute()), len(calls)


def catch_up(
    connection: redis.Redis,
    keys: Keys,
    complete: Any,
    waits: list[tuple[str, str, dict[str, Any]]],
) -> int:
    """End new ``(task id, kind, wait)`` registrations that an event the watcher has
    already read would have satisfied: the events written between the start-task and
    the registration. Later events reach the watcher itself. Returns waits ended."""
    groups = connection.xinfo_groups(keys.lifecycle)
    read = next(
        (g["last-delivered-id"] for g in groups if _text(g["name"]) == WAIT_EVENTS_GROUP), None
    )
    if read is None:  # no watcher yet: when it starts it reads the stream from the beginning
        return 0
    ended = 0
    for task_id, kind, wait in waits:
        cursor = f"{entry_order(wait['since'])[0]}-0"
        while True:
            entries: list[tuple[bytes, dict[bytes, bytes]]] = connection.xrange(  # type: ignore[assignment]
                keys.lifecycle, cursor, _text(read), count=1000
            )  # a bytes client: redis-py's annotation also allows str and None
            batch = [(i.decode(), _decode(f)) for i, f in entries]
            found, _ = end_waits(connection, keys, complete, batch, {kind: [(task_id, wait)]})
            ended += found
            if found or len(entries) < 1000:
                break
            cursor = "(" + entries[-1][0].decode()
    return ended


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _decode(fields: dict[bytes, bytes]) -> dict[str, Any]:
    return decode_lenient(fields)


class EventWatcher(EventListener):
    """Ends registered wait:event tasks when their event appears on the lifecycle stream."""

    def __init__(self, keys: Keys | None = None, **options: Any) -> None:
        self.keys = keys or Keys()
        options.setdefault("batch_size", 200)
        options.setdefault("claim_idle", 10.0)
        # The lifecycle group owns the stream: it dead-letters what cannot be decoded.
        options.setdefault("own_garbage", False)
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
        ended, matched = end_waits(self.connection, self.keys, self._complete, batch, registered)
        if matched:
            self.ended += ended
            log.info("wait:event: %d of %d matching waits ended", ended, matched)
        return []
