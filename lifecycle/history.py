"""Timelines: what happened to one workflow, from archived or live stream entries.

Replay (from the archive) and ``python -m lifecycle history`` (from Redis)
build the same timeline with :func:`timeline`, so the two can be compared line
by line. Entry ids carry the Redis server's clock in milliseconds, shared by
all streams, so entries of several streams sort into one time line.

The streams in Redis hold only part of a timeline once the receipts worker
trimmed what it archived: :func:`lost_streams` tells which streams may have
lost entries of one workflow, and :func:`where_the_rest_is` where they are.
"""

from __future__ import annotations

from typing import Any

import orjson
import redis

from lifecycle import events as ev
from lifecycle.audit.archive import id_order
from lifecycle.inspect import iso, read_workflow, shown_raw
from lifecycle.keys import RECEIPTS_GROUP, Keys

__all__ = [
    "Entry",
    "engine_streams",
    "format_timeline",
    "live_history",
    "lost_streams",
    "timeline",
    "where_the_rest_is",
]

# A workflow's ``created`` is the lifecycle worker's clock when it applied the
# start-workflow; the entry's id is Redis's clock when it was appended. This much
# skew between the two is allowed when looking for the entry near ``created``.
CLOCK_SLACK_MS = 5_000

Entry = tuple[str, str, dict[str, Any]]  # (stream, entry id, event)

_SHOWN = {
    ev.START_WORKFLOW,
    ev.START_TASK,
    ev.END_TASK,
    ev.RETRY_TASK,
    ev.TIMEOUT_TASK,
    ev.TERMINATE_WORKFLOW,
    ev.END_WORKFLOW,
    ev.FAILED_WORKFLOW,
}


def timeline(entries: list[Entry]) -> list[dict[str, Any]]:
    """One row per workflow event, in time order: who started/ended which attempt, when."""
    rows = []
    names: dict[str, Any] = {}  # key -> task name, from its start-task (end-tasks omit it)
    for stream, entry_id, event in sorted(entries, key=lambda e: id_order(e[1])):
        kind = event.get("kind")
        if kind not in _SHOWN:
            continue
        row: dict[str, Any] = {"at": iso(id_order(entry_id)[0]), "event": kind, "entry": entry_id}
        for name in ("key", "attempt", "name", "status", "worker", "error", "reason"):
            if event.get(name) is not None:
                row[name] = event[name]
        key = row.get("key")
        if kind == ev.START_TASK:
            row["stream"] = stream
            if isinstance(key, str):
                names[key] = event.get("name")
        elif isinstance(key, str) and "name" not in row and names.get(key) is not None:
            row["name"] = names[key]
        rows.append(row)
    return rows


def format_timeline(rows: list[dict[str, Any]]) -> list[str]:
    """Text lines, e.g. ``12:00:00.130  end-task    3.1 attempt 2  SUCCESS  by noop-1``."""
    lines = []
    for row in rows:
        at = (row["at"] or "")[11:23]
        what = row["event"]
        if "key" in row:
            what += f" {row.get('name') or ''} ({row['key']}) attempt {row.get('attempt', '?')}"
        if "status" in row:
            what += f" {row['status']}"
        if "worker" in row:
            what += f" by {row['worker']}"
        if row.get("error") or row.get("reason"):
            what += f": {row.get('error') or row.get('reason')}"
        lines.append(f"{at}  {what}  [{row['entry']}]")
    return lines


def engine_streams(client: redis.Redis, keys: Keys) -> list[str]:
    """The lifecycle stream and every task kind's stream (a workflow's events)."""
    members: Any = client.smembers(keys.kinds)
    kinds = sorted(k.decode("utf-8", "replace") for k in members)
    return [keys.lifecycle] + [keys.tasks(kind) for kind in kinds]


def live_history(client: redis.Redis, keys: Keys, workflow_id: str) -> dict[str, Any]:
    """The workflow's record plus its timeline from the entries the streams still hold.

    Streams are trimmed once archived, so a workflow's timeline may be partial
    here: ``complete`` is False when its start-workflow is no longer in the
    lifecycle stream or a stream lost entries from its start on; ``lost`` names
    those streams and ``rest`` says where the whole timeline is (``replay`` on
    the archive has all of it). Fields of the record or of an entry that cannot be
    read are listed under ``corrupt``.
    """
    record = read_workflow(client, keys, workflow_id)
    problems = [str(p) for p in record.problems]
    needle = orjson.dumps(workflow_id)
    entries: list[Entry] = []
    start_id = None
    for stream in engine_streams(client, keys):
        for raw_id, fields in _scan(client, stream):
            if fields.get(b"workflow") == needle:
                entry_id = raw_id.decode()
                event, bad = _decode(fields)
                problems += [f"corrupt entry {stream} {entry_id}: {b}" for b in bad]
                entries.append((stream, entry_id, event))
                first = start_id is None and stream == keys.lifecycle
                if first and event.get("kind") == ev.START_WORKFLOW:
                    start_id = entry_id
    lost = lost_streams(client, keys, workflow_id, record.created, start_id=start_id, look=False)
    return {
        "workflow": workflow_id,
        "graph": record.graph,
        "state": record.shown_state,
        "output": record.output,
        "error": record.error,
        "complete": not lost,
        "lost": lost,
        "rest": where_the_rest_is(client, keys, workflow_id) if lost else None,
        "timeline": timeline(entries),
        "corrupt": problems,
    }


def lost_streams(
    client: redis.Redis,
    keys: Keys,
    workflow_id: str,
    created_ms: int | None,
    *,
    start_id: str | None = None,
    look: bool = True,
) -> list[str]:
    """The engine streams that may have lost entries of this workflow (empty: Redis
    still holds its whole timeline).

    Trimming removes a stream's oldest entries: a stream lost none of the
    workflow's if it never lost any entry (XINFO STREAM's entries-added equals its
    length, and no XDEL reached past the start), or if its first remaining entry is
    at or before the workflow's start-workflow entry (``start_id``; when not given
    and ``look``, looked for in the lifecycle stream up to ``created_ms``, only once
    some stream lost entries). A start-workflow no longer in the lifecycle stream means the
    start of the timeline is gone. One XINFO STREAM per stream, plus that look-up.
    """
    trimmed: dict[str, tuple[int, int]] = {}
    for stream in engine_streams(client, keys):
        bound = _removed_below(client, stream)
        if bound is not None:
            trimmed[stream] = bound
    if not trimmed:
        return []
    if start_id is None and look:
        start_id = _find_start(client, keys, workflow_id, created_ms)
    if start_id is None:
        since = (max((created_ms or 0) - CLOCK_SLACK_MS, 0), 0)
        lost = [keys.lifecycle]
    else:
        since = id_order(start_id)
        lost = []
    lost += [s for s, bound in trimmed.items() if bound > since and s not in lost]
    return lost


def _removed_below(client: redis.Redis, stream: str) -> tuple[int, int] | None:
    """The id below which ``stream`` may have lost entries, None when it lost none."""
    try:
        info: Any = client.xinfo_stream(stream)
    except redis.ResponseError:  # no such key (or not a stream): nothing there to lose
        return None
    length = int(info.get("length", 0))
    added = info.get("entries-added")  # Redis 7.0 on; before, only the first entry tells
    deleted = id_order(_text(info.get("max-deleted-entry-id") or "0-0"))
    if added is not None and int(added) <= length and deleted == (0, 0):
        return None
    if length:
        first = info.get("first-entry")
        bound = id_order(_text(first[0])) if first else (0, 0)
    else:  # emptied: everything up to the last id is gone
        last = id_order(_text(info.get("last-generated-id") or "0-0"))
        bound = (last[0], last[1] + 1)
    # An XDEL (a requeue, an operator) may have removed any entry up to its id.
    return max(bound, (deleted[0], deleted[1] + 1)) if deleted != (0, 0) else bound


def _find_start(
    client: redis.Redis, keys: Keys, workflow_id: str, created_ms: int | None
) -> str | None:
    """The id of the workflow's start-workflow entry in the lifecycle stream, looked
    for up to a little after ``created_ms`` (it comes before the advance that set it)."""
    needle = orjson.dumps(workflow_id)
    kind = orjson.dumps(ev.START_WORKFLOW)
    until = "+" if created_ms is None else f"{created_ms + CLOCK_SLACK_MS}-0"
    for raw_id, fields in _scan(client, keys.lifecycle, end=until):
        if fields.get(b"workflow") == needle and fields.get(b"kind") == kind:
            return str(raw_id.decode())
    return None


def where_the_rest_is(client: redis.Redis, keys: Keys, workflow_id: str) -> str:
    """Where a timeline no longer in Redis is: the receipts archive, when a receipts
    worker archives these streams (its group is on the lifecycle stream)."""
    try:
        groups: Any = client.xinfo_groups(keys.lifecycle)
    except redis.ResponseError:
        groups = []
    if any(_text(g.get("name", b"")) == RECEIPTS_GROUP for g in groups):
        return (
            "the receipts archive has all of it: "
            f"python -m lifecycle replay ARCHIVE --workflow {workflow_id} --offline"
        )
    return (
        f"no receipts worker archives these streams (no group {RECEIPTS_GROUP!r} on "
        f"{keys.lifecycle}): the removed events are not kept anywhere"
    )


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _decode(fields: dict[bytes, bytes]) -> tuple[dict[str, Any], list[str]]:
    """An entry's event, and a line per field that is not JSON (left out of the event)."""
    event: dict[str, Any] = {}
    bad = []
    for name, value in fields.items():
        text = name.decode("utf-8", "replace")
        try:
            event[text] = orjson.loads(value)
        except orjson.JSONDecodeError as error:
            bad.append(f"field {text}: not JSON: {error} (raw: {shown_raw(value)})")
    return event, bad


def _scan(client: redis.Redis, stream: str, page: int = 5000, end: str = "+") -> Any:
    """All entries of ``stream`` up to ``end``, a page at a time (exclusive ranges
    after the first)."""
    start = "-"
    while True:
        rows: Any = client.xrange(stream, start, end, count=page)
        yield from rows
        if len(rows) < page:
            return
        start = "(" + rows[-1][0].decode()
