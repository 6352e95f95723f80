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

from pathlib import Path
from typing import Any

import orjson
import redis

from lifecycle import events as ev
from lifecycle.audit.archive import ArchivedEvent, id_order, iter_archive
from lifecycle.engine.store import GraphCache
from lifecycle.errors import BadEvent
from lifecycle.inspect import (
    StoredWorkflow,
    archive_record,
    describe_workflow,
    iso,
    read_workflow,
    replay_command,
    shown_raw,
)
from lifecycle.keys import RECEIPTS_GROUP, Keys
from lifecycle.priorities import task_streams
from rqse.client import scan_entries
from rqse.keys import DEAD_LETTER_SUFFIX

__all__ = [
    "Entry",
    "archived_entries",
    "engine_streams",
    "format_timeline",
    "inspected",
    "live_history",
    "lost_streams",
    "timeline",
    "where_the_rest_is",
]

Entry = tuple[str, str, dict[str, Any]]  # (stream, entry id, event)

_SHOWN = {
    *ev.CONTROLS,
    ev.START_WORKFLOW,
    ev.START_TASK,
    ev.END_TASK,
    ev.RETRY_TASK,
    ev.TIMEOUT_TASK,
    ev.TERMINATE_WORKFLOW,
    ev.END_WORKFLOW,
    ev.FAILED_WORKFLOW,
}


def timeline(
    entries: list[Entry], from_archive: set[tuple[str, str]] | None = None
) -> list[dict[str, Any]]:
    """One row per workflow event, in time order: who started/ended which attempt, when;
    ``archived: true`` on the rows of ``from_archive`` (stream, entry id) pairs."""
    rows = []
    names: dict[str, Any] = {}  # key -> task name, from its start-task (end-tasks omit it)
    for stream, entry_id, event in in_time_order(entries):
        kind = event.get("kind")
        if kind not in _SHOWN:
            continue
        row: dict[str, Any] = {"at": iso(id_order(entry_id)[0]), "event": kind, "entry": entry_id}
        if from_archive and (stream, entry_id) in from_archive:
            row["archived"] = True
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


def in_time_order(entries: list[Entry]) -> list[Entry]:
    """``entries`` by id; within one millisecond, a start-task before the answer to it.

    Ids order entries of one stream, but two streams count their sequence numbers
    apart: an end-task on the lifecycle stream and the start-task it answers on a
    task stream may both be ``<ms>-0``, and the id alone would put the answer first.
    """
    ordered: list[Entry] = []
    for entry in sorted(entries, key=lambda e: id_order(e[1])):
        event = entry[2]
        if event.get("kind") == ev.START_TASK:
            ms = id_order(entry[1])[0]
            answered = (event.get("key"), event.get("attempt"))
            index = len(ordered)
            while index and id_order(ordered[index - 1][1])[0] == ms:
                index -= 1
                earlier = ordered[index][2]
                if earlier.get("kind") == ev.END_TASK and answered == (
                    earlier.get("key"),
                    earlier.get("attempt"),
                ):
                    ordered.insert(index, entry)
                    break
            else:
                ordered.append(entry)
            continue
        ordered.append(entry)
    return ordered


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
        mark = "  (archive)" if row.get("archived") else ""
        lines.append(f"{at}  {what}  [{row['entry']}]{mark}")
    return lines


def engine_streams(client: redis.Redis, keys: Keys) -> list[str]:
    """The lifecycle stream and every task stream, priority streams included (a
    workflow's events)."""
    return [keys.lifecycle] + [found.stream for found in task_streams(client, keys)]


def inspected(
    client: redis.Redis, keys: Keys, workflow_id: str, graphs: GraphCache | None = None
) -> dict[str, Any]:
    """What ``inspect --json`` shows: :func:`lifecycle.inspect.describe_workflow`'s data,
    ``timeline_lost`` (the streams trimmed of its earlier events) and ``timeline_rest``
    (where the whole timeline is, when part of it is lost)."""
    data = describe_workflow(client, keys, workflow_id, graphs=graphs)
    lost = lost_streams(client, keys, read_workflow(client, keys, workflow_id))
    data["timeline_lost"] = lost
    data["timeline_rest"] = where_the_rest_is(client, keys, workflow_id) if lost else None
    return data


def live_history(
    client: redis.Redis, keys: Keys, workflow_id: str, archive: str | Path | None = None
) -> dict[str, Any]:
    """The workflow's record plus its timeline from the entries the streams still hold
    and, when part of it is gone and ``archive`` names a receipts archive directory,
    from the archive (:func:`archived_entries`: it reads the whole archive).

    Streams are trimmed once archived, so a workflow's timeline may be partial
    here: ``complete`` is False when part of it is gone (:func:`lost_streams`);
    ``lost`` names those streams and ``rest`` says where the whole timeline is
    (``replay`` on the archive has all of it). Rows read from the archive have
    ``archived: true``; ``archive`` is the directory read (None: none). Fields of
    the record or of an entry that cannot be read are listed under ``corrupt``.
    """
    record = read_workflow(client, keys, workflow_id)
    problems = [str(p) for p in record.problems]
    needle = orjson.dumps(workflow_id)
    live: list[Entry] = []
    for stream in engine_streams(client, keys):
        for raw_id, fields in scan_entries(client, stream, 5000):
            found, bad = _entries_of(stream, raw_id.decode(), fields, workflow_id, needle)
            live += found
            problems += bad
    entries = _current_run(live, keys)
    lost = lost_streams(client, keys, record, entries)
    read, from_archive = None, set()
    if lost and archive is not None:
        held = {(stream, entry_id) for stream, entry_id, _ in live}
        extra = [
            e for e in archived_entries(archive, keys, workflow_id) if (e[0], e[1]) not in held
        ]
        from_archive = {(stream, entry_id) for stream, entry_id, _ in extra}
        entries = _current_run(live + extra, keys)
        lost = lost_streams(client, keys, record, entries)
        read = str(archive)
    return {
        "workflow": workflow_id,
        "graph": record.graph,
        "state": record.shown_state,
        "output": record.output,
        "error": record.error,
        "complete": not lost,
        "lost": lost,
        "rest": where_the_rest_is(client, keys, workflow_id) if lost else None,
        "archive": read,
        "timeline": timeline(entries, from_archive),
        "corrupt": problems,
    }


def _current_run(entries: list[Entry], keys: Keys) -> list[Entry]:
    """The entries of the workflow's latest run: an id deleted and then started again
    has the old run's entries in the streams too (the archive keeps both; ``replay``
    starts a deleted id afresh as well). The run starts at the first start-workflow
    after a delete-workflow: lifecycle entries from its id on, task entries from its
    millisecond on (ids of two streams compare only by time)."""
    deleted, start = False, None
    for stream, entry_id, event in sorted(entries, key=lambda e: id_order(e[1])):
        if stream != keys.lifecycle:
            continue
        if event.get("kind") == ev.DELETE_WORKFLOW:
            deleted = True
        elif deleted and event.get("kind") == ev.START_WORKFLOW:
            deleted, start = False, id_order(entry_id)
    if start is None:
        return entries
    return [
        e
        for e in entries
        if (id_order(e[1]) >= start if e[0] == keys.lifecycle else id_order(e[1])[0] >= start[0])
    ]


def lost_streams(
    client: redis.Redis,
    keys: Keys,
    record: StoredWorkflow,
    entries: list[Entry] | None = None,
) -> list[str]:
    """The engine streams that lost entries of this workflow (empty: Redis still holds
    its whole timeline). ``entries``: the workflow's entries already read from every
    engine stream (``history``); without them they are read only when needed.

    Trimming removes a stream's oldest entries and leaves no trace of which, so:

    * a stream that never lost an entry (XINFO STREAM's entries-added equals its
      length, no XDEL) lost none of this workflow's: one XINFO per stream, and
      most of the time that is all;
    * the lifecycle stream lost part of it when its start-workflow is not there
      (every later event of the workflow follows it, and trimming only removes
      a prefix);
    * the task streams lost part of it when a task instance's record counts
      attempts whose start-task is in no stream.

    The last two read the streams that lost entries (and, when a task stream did,
    every task stream), which the receipts worker keeps short by trimming them.
    """
    streams = engine_streams(client, keys)
    trimmed = [s for s in streams if _lost_entries(client, s)]
    if not trimmed and entries is not None:
        return [] if any(_is_start(e, keys) for e in entries) else [keys.lifecycle]
    if not trimmed:
        return []
    if entries is None:
        # The lifecycle stream if it lost entries; every task stream if one did (which
        # stream a task instance's start-tasks went to is not in its record).
        read = [keys.lifecycle] if keys.lifecycle in trimmed else []
        if any(s != keys.lifecycle for s in trimmed):
            read += streams[1:]
        needle = orjson.dumps(record.id)
        entries = [
            entry
            for stream in read
            for raw_id, fields in scan_entries(client, stream, 5000)
            for entry in _entries_of(stream, raw_id.decode(), fields, record.id, needle)[0]
        ]
    lost = []
    if keys.lifecycle in trimmed and not any(_is_start(e, keys) for e in entries):
        lost.append(keys.lifecycle)
    started: dict[str, set[Any]] = {}
    for stream, _, event in entries:
        if stream != keys.lifecycle and event.get("kind") == ev.START_TASK:
            started.setdefault(str(event.get("key")), set()).add(event.get("attempt"))
    held = set(map(str, record.paused or []))
    for key, (attempt, _, _) in record.starts.items():
        if not isinstance(attempt, int):
            continue
        wanted = set(range(1, attempt + (0 if key in held else 1)))
        if not wanted <= started.get(key, set()):
            lost += [s for s in trimmed if s != keys.lifecycle]
            break
    return lost


def _is_start(entry: Entry, keys: Keys) -> bool:
    return entry[0] == keys.lifecycle and entry[2].get("kind") == ev.START_WORKFLOW


def _lost_entries(client: redis.Redis, stream: str) -> bool:
    """Whether ``stream`` ever lost an entry (trimmed or deleted)."""
    try:
        info: Any = client.xinfo_stream(stream)
    except redis.ResponseError:  # no such key (or not a stream): nothing there to lose
        return False
    added = info.get("entries-added")
    if added is None:  # before Redis 7.0: the first entry cannot tell; assume it may have
        return True
    deleted = _text(info.get("max-deleted-entry-id") or "0-0")
    return int(added) > int(info.get("length", 0)) or deleted != "0-0"


def where_the_rest_is(client: redis.Redis, keys: Keys, workflow_id: str) -> str:
    """Where a timeline no longer in Redis is: the receipts archive, when a receipts
    worker archives these streams (its group is on the lifecycle stream), named by
    the path and host it recorded (``Keys.archive``)."""
    archive = archive_record(client, keys)
    replay = replay_command(workflow_id, archive)
    if archive is not None:
        history = f"python -m lifecycle history {workflow_id}"
        if not archive.here():
            history += " --archive DIR"
        replay = f"{history}, or {replay}"
    try:
        groups: Any = client.xinfo_groups(keys.lifecycle)
    except redis.exceptions.NoPermissionError:  # a user that may not ask: say both cases
        return f"if a receipts worker archives these streams, its archive has it: {replay}"
    except redis.ResponseError:
        groups = []
    if any(_text(g.get("name", b"")) == RECEIPTS_GROUP for g in groups):
        where = f" at {archive.place()}" if archive else ""
        return f"the receipts archive{where} has all of it: {replay}"
    return (
        f"no receipts worker archives these streams (no group {RECEIPTS_GROUP!r} on "
        f"{keys.lifecycle}): the removed events are not kept anywhere"
    )


def archived_entries(directory: str | Path, keys: Keys, workflow_id: str) -> list[Entry]:
    """The workflow's entries in the receipts archive at ``directory`` (engine streams,
    not their dead letters). Streams the archive a line at a time: it reads every
    segment, so it costs time in proportion to the archive's size (the segments are
    not indexed by workflow) and memory in proportion to this workflow's entries."""
    # A bytes test skips most lines; not for an id a writer may have escaped otherwise.
    needle = orjson.dumps(workflow_id) if workflow_id.isascii() else b""
    found: list[Entry] = []
    for item in iter_archive(directory):
        if not isinstance(item, ArchivedEvent) or needle not in item.line:
            continue
        stream, entry_id, event = item.stream, item.id, item.event
        if stream is None or entry_id is None or event is None:
            continue
        if stream.endswith(DEAD_LETTER_SUFFIX) or not stream.startswith(keys.prefix + ":"):
            continue
        if event.get("workflow") == workflow_id:
            found.append((stream, entry_id, event))
        elif event.get("kind") == ev.END_TASKS:
            found += _answers_of(stream, entry_id, event, workflow_id)
        elif event.get("kind") == ev.START_TASKS:
            found += _starts_of(stream, entry_id, event, workflow_id)[0]
    return found


_END_TASKS_JSON = orjson.dumps(ev.END_TASKS)


def _entries_of(
    stream: str, entry_id: str, fields: dict[bytes, bytes], workflow_id: str, needle: bytes
) -> tuple[list[Entry], list[str]]:
    """The events of ``workflow_id`` (``needle``: its id in JSON) a stream entry stands
    for: itself, or those of its tasks an end-tasks or start-tasks entry packs; and a
    line per part of it that cannot be read. Tells from the raw fields first: most
    entries are another workflow's, and are not decoded."""
    kind = fields.get(b"kind")
    if fields.get(b"workflow") == needle:
        event, bad = _decode(fields)
        return [(stream, entry_id, event)], [f"corrupt entry {stream} {entry_id}: {b}" for b in bad]
    if kind == _END_TASKS_JSON and needle in fields.get(b"answers", b""):
        return _answers_of(stream, entry_id, _decode(fields)[0], workflow_id), []
    if ev.is_start_tasks(kind) and needle in fields.get(b"tasks", b""):
        event, bad = _decode(fields)
        if bad:  # its tasks are not JSON: they cannot be told apart
            return [], [f"corrupt entry {stream} {entry_id}: {b}" for b in bad]
        return _starts_of(stream, entry_id, event, workflow_id)
    return [], []


def _answers_of(stream: str, entry_id: str, event: dict[str, Any], workflow_id: str) -> list[Entry]:
    """The answers to ``workflow_id``'s tasks an end-tasks entry packs, each as the
    end-task it stands for (lifecycle.events.unpacked_answers), under the entry's id."""
    try:
        answers = ev.unpacked_answers(entry_id, event)
    except BadEvent:
        return []
    return [(stream, entry_id, a) for a in answers if a["workflow"] == workflow_id]


def _starts_of(
    stream: str, entry_id: str, event: dict[str, Any], workflow_id: str
) -> tuple[list[Entry], list[str]]:
    """The start-tasks of ``workflow_id`` a start-tasks entry packs, each as the
    start-task it stands for (lifecycle.events.unpacked_starts), under the entry's id;
    and why its tasks cannot be read, when its ``tasks`` is not a list."""
    try:
        starts = ev.unpacked_starts(entry_id, event)
    except BadEvent as error:
        return [], [f"corrupt entry {stream} {entry_id}: {error}"]
    return [(stream, entry_id, s) for s in starts if s["workflow"] == workflow_id], []


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
