"""What ``inspect``, ``list`` and ``history`` show: workflow records turned into plain data.

These readers never trust what they read: a stored field that is not JSON, nests
too deep, has the wrong type or is missing is reported as a :class:`Problem`
(``corrupt record: field s: ...`` with its raw value) and the rest of the record,
and every other workflow, is shown all the same.

A workflow whose hash is gone (never submitted, deleted, or removed by retention)
is :class:`UnknownWorkflow` for ``inspect`` and ``history``, and left out of
``list`` even while its id is still in ``{flow}:workflows``.

States shown: the machine's ``running``, ``finished``, ``failed``, ``terminated``,
and ``paused`` for a running workflow whose hash holds the paused field
(:data:`lifecycle.records.PAUSED`); ``corrupt`` when the state cannot be read.
"""

from __future__ import annotations

import base64
import os
import shlex
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import redis

from flowlang.graph import Graph, NodeKind
from flowlang.limits import DEFAULT_LIMITS, loads_value
from flowlang.machine import parse_key
from lifecycle import compact
from lifecycle import records as rec
from lifecycle.engine.store import GraphCache
from lifecycle.errors import LifecycleError, UnknownWorkflow, unknown_workflow
from lifecycle.keys import Keys
from lifecycle.partitions import archive_root
from lifecycle.stored_state import is_chunked, state_from_fields

__all__ = [
    "ArchiveRecord",
    "CORRUPT",
    "LIST_STATES",
    "Problem",
    "StoredWorkflow",
    "archive_record",
    "describe_workflow",
    "iso",
    "list_page",
    "list_workflows",
    "newest",
    "read_workflow",
    "replay_command",
    "shown_raw",
    "no_workflow",
]

CORRUPT = "corrupt"  # the state shown for a workflow whose state field cannot be read
# What ``list --state`` accepts: every state a workflow is shown in.
LIST_STATES = (*rec.SHOWN_STATES, CORRUPT)
RAW_SHOWN = 200  # characters of a corrupt value shown
LIST_PAGE = 500  # ids read per round trip by list_workflows

# Task instances of a finished workflow that never started, by why (see _unstarted).
SKIPPED_GUARD = "skipped (guard)"
SKIPPED_SUBFLOW_GUARD = "skipped (subflow guard)"
NOT_STARTED = "not started"
HELD = "held (paused)"  # started while paused: recorded, sent by the resume


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    except (OverflowError, ValueError, OSError, TypeError):
        return str(ms)  # out of the calendar's range: shown as stored


def shown_raw(raw: bytes) -> str:
    """A stored value as it can be shown: its text, else ``base64:...``; shortened."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = "\0"  # not text: shown in base64 below
    if not text.isprintable():
        text = "base64:" + base64.b64encode(raw[:RAW_SHOWN]).decode()
    return text if len(text) <= RAW_SHOWN else text[: RAW_SHOWN - 1] + "…"


@dataclass(frozen=True)
class Problem:
    """A stored field that cannot be read as what it should be."""

    field: str
    message: str
    raw: str | None = None  # shown_raw of the value, None when the field is missing

    def __str__(self) -> str:
        raw = "" if self.raw is None else f" (raw: {self.raw})"
        return f"corrupt record: field {self.field}: {self.message}{raw}"


@dataclass
class StoredWorkflow:
    """A workflow's hash as read, each field checked; ``problems`` lists the ones that
    could not be read (their values here are None)."""

    id: str
    graph: str | None = None
    name: str | None = None
    status: str = CORRUPT
    created: int | None = None
    ended: int | None = None
    input: Any = None
    output: Any = None
    error: str | None = None
    running: dict[str, Any] = field(default_factory=dict)
    # key -> [attempt, started ms, input], [ended ms, ok, output, error, worker]: the times
    # made times (records.record_time)
    starts: dict[str, list[Any]] = field(default_factory=dict)
    ends: dict[str, list[Any]] = field(default_factory=dict)
    paused: list[Any] | None = None  # held task keys while paused, else None
    concurrency: Any = None  # {"key", "max"[, "queued"]} under a concurrency key, else None
    compacted: int | None = None  # ms: when its task records went (it finished long ago)
    priority: int = 0  # lifecycle.priorities
    problems: list[Problem] = field(default_factory=list)

    @property
    def shown_state(self) -> str:
        """The state as shown: ``paused`` for a running workflow that is paused,
        ``queued`` for one waiting for its concurrency key."""
        queued = isinstance(self.concurrency, dict) and self.concurrency.get("queued") is True
        return rec.shown_state(self.status, self.paused is not None, queued)


class _Bad(Exception):
    pass


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _Bad("not UTF-8 text") from None


def _int(raw: bytes) -> int:
    try:
        return int(raw)
    except ValueError:
        raise _Bad("not an integer") from None


def _json(raw: bytes) -> Any:
    try:
        return loads_value(raw, DEFAULT_LIMITS, "the value")
    except Exception as error:  # noqa: BLE001 - LimitExceeded, or anything a bad value raises
        message = str(error)
        raise _Bad(message.removeprefix("the value is ").removeprefix("the value ")) from None


def _opt(value: Any, kind: type, what: str) -> None:
    """``value`` is None or a ``kind`` (True is no int here, as JSON tells them apart)."""
    if value is None or (isinstance(value, kind) and (kind is bool or type(value) is not bool)):
        return
    raise _Bad(f"{what} is {type(value).__name__}, expected {kind.__name__} or null")


def _state(raw: bytes) -> dict[str, Any]:
    state = _json(raw)
    if not isinstance(state, dict):
        raise _Bad(f"is {type(state).__name__}, expected an object")
    status = state.get("status", rec.RUNNING)
    if status not in rec.STATES:
        raise _Bad(f"status {status!r} is none of {', '.join(rec.STATES)}")
    if not isinstance(state.get("running", {}), dict):
        raise _Bad("running is not an object")
    _opt(state.get("error"), str, "error")
    return state


def _start(raw: bytes) -> list[Any]:
    value = _json(raw)
    if not isinstance(value, list) or len(value) != 3:
        raise _Bad("expected [attempt, started ms, input]")
    _opt(value[0], int, "attempt")
    _opt(value[1], int, "started")
    return value


def _end(raw: bytes) -> list[Any]:
    value = _json(raw)
    if isinstance(value, list) and len(value) == 3:  # its output in a successor's start
        _opt(value[0], int, "ended")
        _opt(value[1], str, "worker")
        if not isinstance(value[2], str):
            raise _Bad("expected [ended ms, worker, successor key]")
        return value
    if not isinstance(value, list) or len(value) != 5:
        raise _Bad("expected [ended ms, ok, output, error, worker]")
    _opt(value[0], int, "ended")
    _opt(value[1], bool, "ok")
    _opt(value[3], str, "error")
    _opt(value[4], str, "worker")
    return value


def _paused(raw: bytes) -> list[Any]:
    value = _json(raw)
    if not isinstance(value, list):
        raise _Bad(f"is {type(value).__name__}, expected a list of task keys")
    return value


@dataclass(frozen=True)
class ArchiveRecord:
    """Where the receipts worker archives (``Keys.archive``, set at its start)."""

    path: str
    host: str

    def here(self) -> bool:
        """Whether the archive is a directory of this host (history can read it)."""
        return self.host == socket.gethostname() and os.path.isdir(self.path)

    def place(self) -> str:
        """``/var/lib/flow/receipts on host worker-3`` (``on this host`` when it is)."""
        host = "this host" if self.host == socket.gethostname() else f"host {self.host}"
        return f"{self.path} on {host}"


def archive_record(client: redis.Redis, keys: Keys) -> ArchiveRecord | None:
    """The recorded archive, or None: none recorded (no receipts worker ran since it
    records, or a sink without a directory), unreadable, or not allowed to read."""
    try:
        raw: Any = client.get(keys.archive)
        value = orjson.loads(raw) if raw else None
    except (redis.ResponseError, orjson.JSONDecodeError):
        return None
    if not isinstance(value, dict):
        return None
    path, host = value.get("path"), value.get("host")
    if not isinstance(path, str) or not isinstance(host, str):
        return None
    return ArchiveRecord(path, host)


def replay_command(workflow_id: str, archive: ArchiveRecord | None) -> str:
    """The command that shows a workflow's history from the archive: with the recorded
    archive's path (and host, when not this one), else the ``ARCHIVE`` placeholder."""
    # A partition's folder: replay takes the receipts directory and finds the folder.
    path = shlex.quote(archive_root(archive.path)) if archive else "ARCHIVE"
    command = f"python -m lifecycle replay {path} --workflow {shlex.quote(workflow_id)} --offline"
    if archive and archive.host != socket.gethostname():
        command += f" (on host {archive.host})"
    return command


def no_workflow(client: redis.Redis, keys: Keys, workflow_id: str) -> UnknownWorkflow:
    """The error for an id with no hash, naming the recorded archive that keeps its
    history (the one wording: lifecycle.errors.unknown_workflow)."""
    archive = archive_record(client, keys)
    return unknown_workflow(workflow_id, replay_command(workflow_id, archive))


def read_workflow(client: redis.Redis, keys: Keys, workflow_id: str) -> StoredWorkflow:
    """The workflow's hash, every field checked; UnknownWorkflow when there is none."""
    raw = compact.read_record(client, keys, workflow_id)
    if not raw:
        raise no_workflow(client, keys, workflow_id)
    return parse_workflow(workflow_id, raw)


def parse_workflow(workflow_id: str, raw: dict[bytes, bytes]) -> StoredWorkflow:
    """A :class:`StoredWorkflow` from the fields of its hash (what :func:`read_workflow`
    and ``list`` read)."""
    found = StoredWorkflow(workflow_id)

    def read(name: str, parse: Any) -> Any:
        value = raw.get(name.encode())
        if value is None:
            return None
        try:
            return parse(value)
        except _Bad as error:
            found.problems.append(Problem(name, str(error), shown_raw(value)))
            return None

    found.graph = read(rec.GRAPH, _text)
    found.name = read(rec.NAME, _text) or None
    found.created = read(rec.CREATED, _int)
    found.ended = read(rec.ENDED, _int)
    found.compacted = read(rec.COMPACTED, _int)
    found.priority = read(rec.PRIORITY, _int) or 0
    found.input = read(rec.INPUT, _json)
    found.paused = read(rec.PAUSED, _paused)
    found.concurrency = read(rec.CONCURRENCY, _json)
    if found.paused is None and rec.PAUSED.encode() in raw:
        found.paused = []  # paused all the same; the field's problem is listed
    if rec.STATE.encode() not in raw:
        found.problems.append(Problem(rec.STATE, "missing"))
    state = read(rec.STATE, _state)
    if state is not None:
        found.status = state.get("status", rec.RUNNING)
        found.error = state.get("error")
        found.running = state.get("running") or {}
        if is_chunked(state):
            try:
                found.running = dict(state_from_fields(raw).running)
            except (ValueError, TypeError) as error:  # orjson's errors are ValueErrors
                found.problems.append(Problem(rec.RUNNING_PREFIX, f"entries unreadable: {error}"))
        found.output = state.get("output") if found.status == rec.FINISHED else None
    for name in raw:
        for prefix, into, parse in (
            (rec.START_PREFIX, found.starts, _start),
            (rec.END_PREFIX, found.ends, _end),
        ):
            if name.startswith(prefix.encode()):
                text = shown_raw(name)
                try:
                    key = name[len(prefix) :].decode("utf-8")
                    parse_key(key)
                except (UnicodeDecodeError, ValueError, IndexError):
                    found.problems.append(Problem(text, "not a task instance key", None))
                    continue
                parsed = read(name.decode(), parse)
                if parsed is not None:
                    at = 1 if into is found.starts else 0  # started, ended
                    parsed[at] = rec.record_time(parsed[at], found.created)
                    into[key] = parsed
    for key, end in found.ends.items():
        found.ends[key] = whole = rec.whole_end(end, found.starts.get)
        if whole is not end and whole[2] is None:  # (a reference is never to a None output)
            found.problems.append(
                Problem(
                    rec.end_field(key),
                    f"its output is the input of task {end[2]}, whose start record is "
                    "missing or unreadable",
                )
            )
    return found


def describe_workflow(
    client: redis.Redis,
    keys: Keys,
    workflow_id: str,
    now_ms: int | None = None,
    graphs: GraphCache | None = None,
) -> dict[str, Any]:
    """State, every task instance with its times, duration, attempts, input and output;
    ``corrupt`` lists the fields that could not be read (shown, not raised).

    Steps of the graph without a record are listed too: in a finished workflow a
    guarded step (or one in a guarded subflow) that never started was skipped by
    its guard; any other step without a record, and every step without one in a
    workflow still running, failed or terminated, is ``not started`` (a skipped
    guard leaves no record, so while the workflow runs it cannot be told from a
    step whose turn has not come). ``duration_ms`` of a running task counts up to
    ``now_ms`` (default: this host's clock, as the worker's that stamped the start).
    ``graphs``: a cache of compiled graphs kept across calls (a server's).
    """
    record = read_workflow(client, keys, workflow_id)
    graph = None
    if record.graph:  # a workflow terminated before it started has no graph
        try:
            graph = (graphs or GraphCache(client, keys)).machine(record.graph).graph
        except Exception as error:  # noqa: BLE001 - an unreadable graph is shown, not raised
            record.problems.append(Problem(rec.GRAPH, f"graph {record.graph}: {error}"))
    if now_ms is None and record.running:
        now_ms = int(time.time() * 1000)
    held = set(map(str, record.paused or []))
    nodes = []
    for key in sorted(set(record.starts) | set(record.ends), key=_key_order):
        attempt, started, task_input = record.starts.get(key, [None, None, None])
        ended, ok, output, failure, worker = record.ends.get(key, [None] * 5)
        if key in held:
            state = HELD  # its start-task waits for the resume
            ended = output = failure = None
        elif key in record.running:
            state = "running"
            ended = output = failure = None
        elif ok is None:
            state = "abandoned"  # the workflow ended (failed, terminated) while it ran
        else:
            state = "ended" if ok else "failed"
        until = ended if ended is not None else now_ms if state == "running" else None
        name, kind = None, "?"
        index = parse_key(key)[0]
        if graph is not None and 0 <= index < len(graph.nodes):
            name, kind = graph.nodes[index].name, str(graph.nodes[index].kind)
        nodes.append(
            {
                "key": key,
                "name": name,
                "kind": kind,
                "state": state,
                "attempts": attempt,
                "started": iso(started),
                "ended": iso(ended),
                "duration_ms": until - started if until is not None and started else None,
                "worker": worker,
                "input": task_input,
                "output": output,
                "error": failure,
            }
        )
    if graph is not None and record.compacted is None:
        nodes += _unstarted(graph, record)
    described = {
        "id": record.id,
        "flow": record.name,
        "graph": record.graph,
        "state": record.shown_state,
        "priority": record.priority,
        "paused": record.paused,
        "created": iso(record.created),
        "ended": iso(record.ended),
        "input": record.input,
        "output": record.output,
        "error": record.error,
        "tasks": nodes,
        "compacted": iso(record.compacted),
        "corrupt": [str(p) for p in record.problems],
    }
    if record.concurrency is not None:  # {"key", "max"[, "queued"]}
        described["concurrency"] = record.concurrency
    return described


def _unstarted(graph: Graph, record: StoredWorkflow) -> list[dict[str, Any]]:
    """A row per step of the graph that has no record at all, with why (see
    :func:`describe_workflow`). Keyed by node index alone: an iterated step with no
    instance never had its items."""
    seen = {parse_key(key)[0] for key in set(record.starts) | set(record.ends)}
    rows = []
    for index, node in enumerate(graph.nodes):
        if index in seen or not _makes_records(node.kind, node.name):
            continue
        state = NOT_STARTED
        if record.status == rec.FINISHED:
            if node.guard is not None:
                state = SKIPPED_GUARD
            elif _in_guarded_subflow(graph, node.parent):
                state = SKIPPED_SUBFLOW_GUARD
        rows.append(
            {
                "key": str(index),
                "name": node.name,
                "kind": str(node.kind),
                "state": state,
                "attempts": None,
                "started": None,
                "ended": None,
                "duration_ms": None,
                "worker": None,
                "input": None,
                "output": None,
                "error": None,
            }
        )
    return rows


def _makes_records(kind: NodeKind, name: str | None) -> bool:
    """Whether a node runs as a task (and so leaves n:/o: records): tasks, named
    sources (URIs) and sinks; literals and subflow brackets never do."""
    return (
        kind is NodeKind.TASK or kind is NodeKind.SINK or (kind is NodeKind.SOURCE and bool(name))
    )


def _in_guarded_subflow(graph: Graph, parent: int | None) -> bool:
    while parent is not None and 0 <= parent < len(graph.nodes):
        if graph.nodes[parent].guard is not None:
            return True
        parent = graph.nodes[parent].parent
    return False


def _key_order(key: str) -> tuple[int, ...]:
    node, path = parse_key(key)
    return (node, *path)


def list_workflows(
    client: redis.Redis,
    keys: Keys,
    state: str | None = None,
    flow: str | None = None,
    limit: int | None = 50,
    index: str | None = None,
) -> list[dict[str, Any]]:
    """Up to ``limit`` summaries (None or 0: all), newest first (by creation time),
    filtered by shown state (:data:`LIST_STATES`) and flow name. ``index``: list the
    ids of that sorted set instead of every workflow (a schedule's runs, newest fire
    time first).

    Ids whose hash is gone (retention or delete removed it and the id's entry in
    ``{flow}:workflows`` is not swept yet) are skipped. A workflow whose record
    cannot be read is listed in state ``corrupt`` with its problems under
    ``corrupt``. Reads :data:`LIST_PAGE` ids per round trip until ``limit`` rows
    match, so a filter that matches few workflows reads them all.
    """
    return list_page(client, keys, state, flow, limit, index=index)[0]


def newest(pages: Sequence[list[dict[str, Any]]], limit: int | None) -> list[dict[str, Any]]:
    """The rows of several partitions' lists merged, newest first, up to ``limit``."""
    if len(pages) == 1:
        return pages[0]
    rows = sorted(
        (row for page in pages for row in page),
        key=lambda row: str(row.get("created") or ""),
        reverse=True,
    )
    return rows[:limit] if limit else rows


def list_page(
    client: redis.Redis,
    keys: Keys,
    state: str | None = None,
    flow: str | None = None,
    limit: int | None = 50,
    cursor: str | None = None,
    graphs: GraphCache | None = None,
    index: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of :func:`list_workflows` after ``cursor`` (None: the newest), and the
    cursor of the next page (None: no more); ``index`` as for :func:`list_workflows`.

    Pages follow the index by score (creation time) and id, not by position, so
    workflows started or removed meanwhile shift no page. With ``graphs``, each
    row also has ``tasks_total`` (steps of its graph that run as tasks) and
    ``tasks_ended`` (of those, the ones with an ended instance; None when the
    record is too large to count cheaply).
    """
    fields = (
        rec.NAME, rec.STATE, rec.CREATED, rec.ENDED, rec.PAUSED, rec.GRAPH, rec.COMPACTED,
        rec.CONCURRENCY,
    )  # fmt: skip
    rows: list[dict[str, Any]] = []
    after = _cursor(cursor)
    last: tuple[float, str] | None = None
    # Ids at the top of the next read already listed: the ones of after's score that
    # sort before it (members of one score come in reverse order).
    skip = 0
    full = False
    while not full:
        high: str | float = "+inf" if after is None else after[0]
        # Without a filter, a page needs no more ids than rows; with one, a full read.
        num = LIST_PAGE
        if limit and not (state or flow or skip):
            num = min(LIST_PAGE, limit - len(rows))
        # ZRANGE BYSCORE REV: the readers' ACL (docs/security.md) grants ZRANGE.
        listed: Any = client.zrange(
            index or keys.workflows,
            high,
            "-inf",
            desc=True,
            byscore=True,
            offset=skip,
            num=num,
            withscores=True,
        )
        read = [(float(score), member.decode("utf-8", "replace")) for member, score in listed]
        page = read if after is None else [row for row in read if row < after]
        if not page:
            if len(read) < num:
                break  # the end of the index
            skip += len(read)  # more ids of after's score than one read: read past them
            continue
        read_rows = compact.read_fields(client, keys, [i for _, i in page], fields)
        for (score, workflow_id), values in zip(page, read_rows, strict=True):
            last = (score, workflow_id)
            if all(v is None for v in values):
                continue  # its hash is gone: no such workflow any more
            raw = {n.encode(): v for n, v in zip(fields, values, strict=True) if v is not None}
            record = parse_workflow(workflow_id, raw)
            if (state and record.shown_state != state) or (flow and record.name != flow):
                continue
            row: dict[str, Any] = {
                "id": workflow_id,
                "flow": record.name,
                "state": record.shown_state,
                "created": iso(record.created),
                "ended": iso(record.ended),
            }
            if graphs is not None:
                row["tasks_total"] = _task_total(graphs, record)
                row["tasks_ended"] = 0 if record.compacted is None else row["tasks_total"]
            if record.problems:
                row["corrupt"] = [str(p) for p in record.problems]
            rows.append(row)
            if limit and len(rows) >= limit:
                full = True
                break
        if len(read) < num:
            break  # the end of the index
        bottom = page[-1][0]
        same = sum(1 for score, _ in page if score == bottom)
        if after is not None and after[0] == bottom:  # still in after's score
            skip += len(read) - len(page) + same
        else:
            skip = same
        after = page[-1]
    if graphs is not None:
        _count_ended(client, keys, [r for r in rows if r["tasks_ended"] == 0])
    following = f"{int(last[0])}:{last[1]}" if full and last is not None else None
    return rows, following


COUNT_FIELDS = 5000  # a record with more fields is not counted in a list (tasks_ended None)


def _cursor(cursor: str | None) -> tuple[float, str] | None:
    if not cursor:
        return None
    score, colon, workflow_id = cursor.partition(":")
    try:
        if not colon:
            raise ValueError
        return (float(int(score)), workflow_id)
    except ValueError:
        raise LifecycleError(f"cursor {cursor[:80]!r}: not a cursor a listing gave") from None


def _task_total(graphs: GraphCache, record: StoredWorkflow) -> int | None:
    if not record.graph:
        return 0  # terminated before it started
    try:
        graph = graphs.machine(record.graph).graph
    except Exception:  # noqa: BLE001 - an unreadable graph leaves the count unknown
        return None
    return sum(1 for node in graph.nodes if _makes_records(node.kind, node.name))


def _count_ended(client: redis.Redis, keys: Keys, rows: list[dict[str, Any]]) -> None:
    """Set ``tasks_ended`` of ``rows``: the steps with an ended instance (an iterated step
    counts once), read in two round trips; None for records too large to count."""
    pipe = client.pipeline(transaction=False)
    for row in rows:
        pipe.hlen(keys.workflow(row["id"]))
    sizes = pipe.execute()
    counted = [row for row, size in zip(rows, sizes, strict=True) if size <= COUNT_FIELDS]
    for row, size in zip(rows, sizes, strict=True):
        if size > COUNT_FIELDS:
            row["tasks_ended"] = None
    pipe = client.pipeline(transaction=False)
    for row in counted:
        pipe.hkeys(keys.workflow(row["id"]))
    prefix = rec.END_PREFIX.encode()
    for row, names in zip(counted, pipe.execute(), strict=True):
        steps = set()
        for name in names:
            if name.startswith(prefix):
                try:
                    steps.add(parse_key(name[len(prefix) :].decode())[0])
                except (UnicodeDecodeError, ValueError, IndexError):
                    continue  # a corrupt field: inspect shows it
        row["tasks_ended"] = len(steps)
