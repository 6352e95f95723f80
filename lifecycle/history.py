"""Timelines: what happened to one workflow, from archived or live stream entries.

Replay (from the archive) and ``python -m lifecycle history`` (from Redis)
build the same timeline with :func:`timeline`, so the two can be compared line
by line. Entry ids carry the Redis server's clock in milliseconds, shared by
all streams, so entries of several streams sort into one time line.
"""

from __future__ import annotations

from typing import Any

import orjson
import redis

from lifecycle import events as ev
from lifecycle.audit.archive import id_order
from lifecycle.inspect import iso, read_workflow, shown_raw
from lifecycle.keys import Keys

__all__ = ["Entry", "format_timeline", "live_history", "timeline"]

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


def live_history(client: redis.Redis, keys: Keys, workflow_id: str) -> dict[str, Any]:
    """The workflow's record plus its timeline from the entries the streams still hold.

    Streams are trimmed once archived, so an old workflow's timeline may be
    partial here (``complete`` False when a stream lost entries from around the
    workflow's start on); ``replay`` on the archive always has all of it. Fields
    of the record or of an entry that cannot be read are listed under ``corrupt``.
    """
    record = read_workflow(client, keys, workflow_id)
    problems = [str(p) for p in record.problems]
    members: Any = client.smembers(keys.kinds)
    kinds = sorted(k.decode("utf-8", "replace") for k in members)
    streams = [keys.lifecycle] + sorted(keys.tasks(kind) for kind in kinds)
    needle = orjson.dumps(workflow_id)
    entries: list[Entry] = []
    complete = True
    for stream in streams:
        if not client.exists(stream):
            continue
        # Trimmed entries this workflow may have had: deleted ones at or after its start.
        deleted = client.xinfo_stream(stream).get("max-deleted-entry-id", b"0-0")
        deleted_ms = id_order(deleted.decode() if isinstance(deleted, bytes) else deleted)[0]
        if deleted_ms and deleted_ms >= (record.created or 0) - 1000:
            complete = False
        for raw_id, fields in _scan(client, stream):
            if fields.get(b"workflow") == needle:
                entry_id = raw_id.decode()
                event, bad = _decode(fields)
                problems += [f"corrupt entry {stream} {entry_id}: {b}" for b in bad]
                entries.append((stream, entry_id, event))
    return {
        "workflow": workflow_id,
        "graph": record.graph,
        "state": record.status,
        "output": record.output,
        "error": record.error,
        "complete": complete,
        "timeline": timeline(entries),
        "corrupt": problems,
    }


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


def _scan(client: redis.Redis, stream: str, page: int = 5000) -> Any:
    """All entries of ``stream``, a page at a time (exclusive ranges after the first)."""
    start = "-"
    while True:
        rows: Any = client.xrange(stream, start, "+", count=page)
        yield from rows
        if len(rows) < page:
            return
        start = "(" + rows[-1][0].decode()
