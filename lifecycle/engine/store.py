"""Compiled graphs and workflow records in Redis (read side, and graph storage)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from flowlang.graph import Graph
from flowlang.limits import DEFAULT_LIMITS, Limits
from flowlang.machine import Machine, State
from lifecycle import compact
from lifecycle import records as rec
from lifecycle.errors import FlowNotStored, UnknownWorkflow
from lifecycle.keys import Keys
from lifecycle.stored_state import state_from_fields

__all__ = ["GraphCache", "WorkflowRecord", "load_workflow"]


class GraphCache:
    """Graphs and their machines by content hash, loaded from Redis once per process.

    A content hash names immutable data, so entries never go stale.
    """

    def __init__(self, client: redis.Redis, keys: Keys, limits: Limits = DEFAULT_LIMITS) -> None:
        self.client = client
        self.keys = keys
        self.limits = limits
        self._machines: dict[str, Machine] = {}

    def machine(self, digest: str) -> Machine:
        found = self._machines.get(digest)
        if found is None:
            data = self.client.get(self.keys.graph(digest))
            if data is None:
                raise FlowNotStored(f"compiled flow {digest} is not stored in Redis")
            found = self._machines[digest] = Machine(Graph.from_json(data), self.limits)
        return found


@dataclass
class WorkflowRecord:
    """A workflow as stored: what ``inspect`` and ``list`` show."""

    id: str
    graph: str
    name: str | None
    status: str
    created: int | None
    ended: int | None
    input: Any
    output: Any
    error: str | None
    state: State
    # key -> [attempt, started ms, input]
    starts: dict[str, list[Any]] = field(default_factory=dict)
    # key -> [ended ms, ok, output, error, worker]
    ends: dict[str, list[Any]] = field(default_factory=dict)
    compacted: int | None = None  # ms: when its task records went (the archive has them)


def _text(value: bytes | None) -> str | None:
    return value.decode() if value is not None else None


def _json(value: bytes | None) -> Any:
    return orjson.loads(value) if value is not None else None


_START, _END = rec.START_PREFIX.encode(), rec.END_PREFIX.encode()


def _timed(value: bytes, at: int, created: int | None) -> Any:
    """A task record decoded, its time at ``at`` made a time (records.record_time)."""
    record = orjson.loads(value)
    if type(record) is list and len(record) > at:
        record[at] = rec.record_time(record[at], created)
    return record


def load_workflow(client: redis.Redis, keys: Keys, workflow_id: str) -> WorkflowRecord:
    raw = compact.read_record(client, keys, workflow_id)
    if not raw:
        raise UnknownWorkflow(f"no workflow {workflow_id!r}")
    created, ended, compacted = raw.get(b"created"), raw.get(b"ended"), raw.get(b"c")
    since = rec.created_ms(created)
    starts, ends = {}, {}
    for name, value in raw.items():
        if name.startswith(_START):
            starts[name[2:].decode()] = _timed(value, 1, since)
        elif name.startswith(_END):
            ends[name[2:].decode()] = _timed(value, 0, since)
    for key, end in ends.items():
        if type(end) is list:
            ends[key] = rec.whole_end(end, starts.get)
    state = state_from_fields(raw)
    return WorkflowRecord(
        id=workflow_id,
        graph=_text(raw.get(b"g")) or "",
        name=_text(raw.get(b"name")) or None,
        status=state.status,
        created=since,
        ended=int(ended) if ended else None,
        input=_json(raw.get(b"input")),
        output=state.output if state.status == "finished" else None,
        error=state.error,
        state=state,
        starts=starts,
        ends=ends,
        compacted=int(compacted) if compacted else None,
    )
