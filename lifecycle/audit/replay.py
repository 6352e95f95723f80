"""Replay: rebuild every workflow from the archive alone and prove it matches.

Each workflow's lifecycle inputs (start-workflow, end-task, retry-task,
timeout-task, terminate-workflow) are fed, in archive order (= the lifecycle
stream's order), one at a time to :meth:`lifecycle.transition.Transition.compute`
— the very code the live lifecycle worker runs before its commit — with the
graph from the archive. What that produces is checked against what the
engine archived: every start-task it emits must exist with the same input and
parameters, every archived start-task must be emitted, and the end-workflow
or failed-workflow must agree. The first mismatch names the diverging input
event. Optionally the result is compared with the workflow's live record.

Why archive order is enough (docs/audit.md, "Replay ordering"): events that
touch one task attempt are causally ordered in the stream — an end-task is
written after its start-task was committed, a retry after the failure that
caused it — and joins sort their inputs, so stream order and any order in
which concurrent lifecycle workers applied them give the same state, outputs
and attempt numbers. Where they could differ (an end-task racing a timeout of
the same attempt), the start-task check reports it instead of hiding it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import redis

from flowlang.graph import Graph
from flowlang.limits import DEFAULT_LIMITS, Limits
from flowlang.machine import ChunkedState, Machine, State
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.audit.archive import id_order
from lifecycle.audit.verify import Finding
from lifecycle.engine.commit import BatchResult, Pending, recorded_inputs
from lifecycle.engine.store import load_workflow
from lifecycle.engine.transition import Transition
from lifecycle.errors import BadEvent, FlowNotStored, UnknownWorkflow
from lifecycle.history import Entry, timeline
from lifecycle.keys import Keys

__all__ = [
    "BEHIND",
    "DELETED",
    "NOT_IN_REDIS",
    "REMOVED",
    "ArchiveGraphs",
    "WorkflowReplay",
    "compare_live",
    "replay_workflow",
]

# What compare_live finds (WorkflowReplay.live), besides "equal" and "different":
NOT_IN_REDIS = "not in Redis"
BEHIND = "lost in Redis"  # Redis holds it at an older point than the archive
# Not in Redis, and rightly so: nothing to recover.
DELETED = "deleted"  # its last archived event is a delete-workflow
REMOVED = "removed after it ended"  # it had ended: retention (or Redis) removed its record

_START_FIELDS = ("name", "index", "key", "attempt", "token", "role", "input", "parameters")
_END_FIELDS = ("kind", "output", "reason")


def _same(first: dict[str, Any], second: dict[str, Any], names: tuple[str, ...]) -> bool:
    """Whether two archived events say the same in ``names``."""
    return all(first.get(name) == second.get(name) for name in names)


class ArchiveGraphs:
    """Compiled graphs from the archive's graph records, checked against their hash."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self.texts: dict[str, str] = {}
        self._machines: dict[str, Machine] = {}

    def add(self, digest: str, text: str) -> Finding | None:
        graph = Graph.from_json(text)
        if graph.content_hash() != digest:
            return Finding(f"graph record {digest}: its text hashes to {graph.content_hash()}")
        self.texts[digest] = text
        return None

    def machine(self, digest: str) -> Machine:
        found = self._machines.get(digest)
        if found is None:
            if digest not in self.texts:
                raise FlowNotStored(f"compiled flow {digest} is not in the archive")
            found = self._machines[digest] = Machine(
                Graph.from_json(self.texts[digest]), self.limits
            )
        return found


@dataclass
class WorkflowReplay:
    """One workflow rebuilt from the archive."""

    workflow: str
    inputs: list[Entry] = field(default_factory=list)  # lifecycle inputs, archive order
    # start-task (a start-tasks pack's each, under its id), end-/failed-workflow
    emitted: list[Entry] = field(default_factory=list)
    state: State | None = None
    fields: dict[str, Any] = field(default_factory=dict)  # the hash fields live would hold
    divergence: Finding | None = None
    # "equal", "different", NOT_IN_REDIS, BEHIND, DELETED, REMOVED, "not checked"
    live: str = "not checked"
    deleted: bool = False  # the replay ends with a delete-workflow
    live_version: str | None = None  # the version (field v) compare_live saw
    rejected: list[str] = field(default_factory=list)  # inputs live dead-lettered too
    timers: dict[str, int] = field(default_factory=dict)  # member -> due ms, still pending
    # What replay emits for inputs after the last archived output of the workflow: the
    # archive (or Redis) stops before that commit; not a divergence, and recover sends them.
    unarchived: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def graph(self) -> str | None:
        value = self.fields.get("g")
        return value.decode() if isinstance(value, bytes) else value

    @property
    def shown_state(self) -> str:
        if self.deleted:
            return DELETED
        return self.state.status if self.state else "never started"

    def diverge(self, entry_id: str, stream: str | None, message: str) -> None:
        if self.divergence is None:  # the first one is the one that matters
            self.divergence = Finding(message, self.workflow, entry_id, stream)

    def summary(self) -> dict[str, Any]:
        state = self.state
        return {
            "workflow": self.workflow,
            "graph": self.graph,
            "state": self.shown_state,
            "output": state.output if state and state.status == "finished" else None,
            "error": state.error if state else None,
            "equal": self.divergence is None,
            "divergence": self.divergence.message if self.divergence else None,
            "diverging_event": self.divergence.event if self.divergence else None,
            "live": self.live,
            "timeline": timeline(self.inputs + self.emitted),
        }


def replay_workflow(item: WorkflowReplay, graphs: ArchiveGraphs, keys: Keys) -> WorkflowReplay:
    """Feed ``item.inputs`` to the live transition code; check against ``item.emitted``."""
    transition = Transition(graphs, keys, graphs.limits)
    starts: dict[StartKey, Entry] = {}
    ends: list[Entry] = []
    for entry in item.emitted:
        if entry[2].get("kind") == ev.START_TASK:
            first = starts.get(_start_key(entry[2]))
            if entry[2].get(ev.RECOVERED) and first is not None:
                continue  # sent again by recover: checked as the original
            if first is not None and _same(first[2], entry[2], _START_FIELDS):
                # Sent again, the same: Redis lost the first (a failover to a replica
                # behind its master, a lost AOF tail) after it was archived, and the
                # engine redid the advance that sent it.
                continue
            if first is not None:
                item.diverge(entry[1], entry[0], f"start-task {entry[2]['id']} archived twice")
            starts[_start_key(entry[2])] = entry
        elif any(_same(end[2], entry[2], _END_FIELDS) for end in ends):
            continue  # an end redone after Redis lost the first, as above
        else:
            ends.append(entry)
    matched: set[StartKey] = set()
    version = 0
    last_output = max((id_order(entry[1]) for entry in item.emitted), default=(-1, -1))
    inputs = list(item.inputs)
    position = 0
    while position < len(inputs):
        stream, entry_id, event = inputs[position]
        position += 1
        kind = str(event.get("kind"))
        try:
            parsed = ev.parse_input(entry_id, kind, event)
        except BadEvent as error:
            item.rejected.append(str(error))
            continue
        if parsed is None:
            continue
        if event.get("packed") is True and type(parsed) is ev.EndTask:
            parsed = replace(parsed, packed=True)  # an answer of an end-tasks entry, as live
        pending = Pending(item.workflow, [(entry_id, kind, parsed)], str(version or ""))
        pending.state, pending.digest = item.state, item.graph
        salt = item.fields.get(rec.SALT)
        pending.salt = salt.decode() if isinstance(salt, bytes) else salt
        priority = item.fields.get(rec.PRIORITY)
        pending.priority = int(priority) if priority is not None else 0
        pending.created = rec.created_ms(item.fields.get(rec.CREATED))
        paused = item.fields.get(rec.PAUSED)
        pending.held = orjson.loads(paused) if paused is not None else None
        concurrency = item.fields.get(rec.CONCURRENCY)
        pending.concurrency = orjson.loads(concurrency) if concurrency is not None else None
        key = getattr(parsed, "key", None)
        if key is not None and rec.start_field(key) in item.fields:
            pending.inputs = {key: orjson.loads(item.fields[rec.start_field(key)])[2]}
        elif kind in (ev.RESUME_WORKFLOW, ev.RESTART_WORKFLOW, ev.ADMIT_WORKFLOW):
            pending.inputs = recorded_inputs(item.fields)
        result = BatchResult()
        commit = transition.compute(pending, result, id_order(entry_id)[0])
        item.rejected += [reason for _, reason in result.rejected]
        if commit is None:
            continue  # a duplicate or stale event: live ignored it too
        version += 1
        if _admitted_in_commit(commit, starts):
            # The gate admitted it in this commit's transaction: applied next, as live.
            inputs.insert(position, (stream, entry_id, _admission(item.workflow)))
        if isinstance(parsed, ev.TaskTimer):  # it fired: no longer pending
            item.timers.pop(ev.timer_member(kind, item.workflow, parsed.key, parsed.attempt), None)
        for member in commit.cancels:
            item.timers.pop(member, None)
        for due, member in zip(commit.timers[::2], commit.timers[1::2], strict=True):
            item.timers[member] = due
        if commit.deleted:  # an id deleted, then started again, starts afresh
            item.fields, item.state, item.timers, version = {}, None, {}, 0
            item.deleted = True
            continue
        item.deleted = False
        names, values = commit.fields[::2], commit.fields[1::2]
        item.fields.update(zip(names, values, strict=True))
        for name in commit.removed:
            item.fields.pop(name, None)
        if type(pending.state) is ChunkedState:  # its entries as the commit wrote them
            item.state = pending.state
        else:  # as the record stores it, decoded as the live lifecycle decodes it
            item.state = State.from_dict(orjson.loads(item.fields[rec.STATE]))
        # Ids count per stream: an output sent in the same millisecond as its input
        # can have the smaller sequence. So past the last archived output's millisecond
        # an input's outputs are unarchived; in that millisecond, those not found are.
        at_ms, last_ms = id_order(entry_id)[0], last_output[0]
        for out_stream, out in _emitted(commit):
            where = f"event {entry_id} ({kind} of {item.workflow})"
            if at_ms > last_ms:
                item.unarchived.append((out_stream, out))
                continue
            if out["kind"] == ev.START_TASK:
                found = _archived_start(starts, out)
                if found is None and at_ms == last_ms:
                    item.unarchived.append((out_stream, out))
                    continue
                if found is None:
                    item.diverge(
                        entry_id,
                        stream,
                        f"{where}: replay starts {out['id']}, the archive never did",
                    )
                    continue
                key, archived = found
                matched.add(key)
                for name in _START_FIELDS:
                    if name not in archived[2] and name not in out:
                        continue
                    if name == "token" and name not in archived[2]:
                        continue  # archived before start-tasks carried tokens
                    if archived[2].get(name) != out.get(name):
                        item.diverge(
                            entry_id,
                            stream,
                            f"{where}: start-task {out['id']} field {name!r} is "
                            f"{_short(archived[2].get(name))} in the archive, "
                            f"replay computes {_short(out.get(name))}",
                        )
                        break
                if archived[0] != out_stream:
                    item.diverge(entry_id, stream, f"{where}: {out['id']} sent to {archived[0]}")
            else:
                archived_end = ends.pop(0) if ends else None
                if archived_end is None and at_ms == last_ms:
                    item.unarchived.append((out_stream, out))
                    continue
                if archived_end is None:
                    item.diverge(
                        entry_id, stream, f"{where}: replay ends it, the archive never did"
                    )
                    continue
                for name in ("kind", "output", "reason"):
                    if archived_end[2].get(name) != out.get(name):
                        item.diverge(
                            entry_id,
                            stream,
                            f"{where}: {out['kind']} field {name!r} is "
                            f"{_short(archived_end[2].get(name))} in the archive "
                            f"({archived_end[1]}), replay computes {_short(out.get(name))}",
                        )
                        break
    for key, (stream, entry_id, _) in starts.items():
        if key not in matched:
            item.diverge(
                entry_id, stream, f"archived start-task {key[0]} ({entry_id}) never started"
            )
    for stream, entry_id, event in ends:
        item.diverge(entry_id, stream, f"archived {event.get('kind')} {entry_id} never happened")
    return item


# A start-task archived: its id (<workflow>/<key>/<attempt>) and its token. Two runs of
# one id (deleted, then started again) send the same ids, with tokens of their own.
StartKey = tuple[str, Any]


def _start_key(event: dict[str, Any]) -> StartKey:
    return str(event.get("id")), event.get("token")


def _archived_start(
    starts: dict[StartKey, Entry], out: dict[str, Any]
) -> tuple[StartKey, Entry] | None:
    """The archived start-task replay's ``out`` stands for: the same id and token, or the
    same id without one (archived before start-tasks carried tokens)."""
    for key in (_start_key(out), (str(out.get("id")), None)):
        archived = starts.get(key)
        if archived is not None:
            return key, archived
    return None


def _admitted_in_commit(commit: Any, starts: dict[StartKey, Entry]) -> bool:
    """Whether the gate admitted the workflow this commit queued in the commit's own
    transaction: the start-tasks it offered are archived as the gate sends them
    (events.ADMITTED; any one will do, as the archive may lag on one task stream). An
    empty offer is archived as an admit-workflow instead."""
    for _, fields in commit.offered_events():
        names = [name.decode() if isinstance(name, bytes) else name for name in fields[::2]]
        offered = {"id": orjson.loads(fields[1 + 2 * names.index("id")])}
        if "token" in names:
            offered["token"] = orjson.loads(fields[1 + 2 * names.index("token")])
        found = _archived_start(starts, offered)
        if found is not None and found[1][2].get(ev.ADMITTED) is True:
            return True
    return False


def _admission(workflow: str) -> dict[str, Any]:
    """The admit-workflow the gate's own admission stands for (see gate.lua)."""
    return {"kind": ev.ADMIT_WORKFLOW, "workflow": workflow, ev.ADMIT_SENT: True}


def _emitted(commit: Any) -> Iterable[tuple[str, dict[str, Any]]]:
    """The events an advance would XADD: (stream, event), decoded from the commit."""
    for stream, pairs in commit.encoded_events():
        names = [name.decode() if isinstance(name, bytes) else name for name in pairs[::2]]
        values = pairs[1::2]
        yield stream, {name: orjson.loads(value) for name, value in zip(names, values, strict=True)}


def _short(value: Any, limit: int = 120) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compare_live(client: redis.Redis, keys: Keys, item: WorkflowReplay) -> None:
    """Set ``item.live``: does the live record agree with the replay (times aside)?

    A live record that is an earlier point of the replayed one (Redis lost its latest
    writes: every start and end it holds the replay has too, the same) is
    :data:`BEHIND`, not a divergence: ``recover`` brings it forward."""
    # The version first: a workflow advanced after this reading shows a newer one to
    # recover, which then leaves it alone.
    version = client.hget(keys.workflow(item.workflow), rec.VERSION)
    item.live_version = version.decode() if isinstance(version, bytes) else None
    try:
        record = load_workflow(client, keys, item.workflow)
    except UnknownWorkflow:
        if item.state is None and not item.deleted:  # never started: Redis agrees
            item.live = "equal"
        elif item.deleted:
            item.live = DELETED
        elif _removed_on_time(client, keys, item):
            item.live = REMOVED
        else:
            item.live = NOT_IN_REDIS
        return
    replayed = item.state.to_whole_dict() if item.state else {}
    conflicts, missing = [], []
    fields = item.fields
    if record.compacted is not None:  # its task records went: the archive's are checked
        fields = {name: value for name, value in fields.items() if name[:2] not in _TASK}
    for key, (attempt, _, task_input) in record.starts.items():
        mine = orjson.loads(fields.get(rec.start_field(key), b"null")) or [None, None, None]
        if [attempt, task_input] != [mine[0], mine[2]]:
            conflicts.append(f"task {key} start [{attempt}, ...] live, [{mine[0]}, ...] replayed")

    def replayed_start(key: str) -> Any:
        return orjson.loads(fields.get(rec.start_field(key), b"null"))

    for key, end in record.ends.items():
        mine = orjson.loads(fields.get(rec.end_field(key), b"null")) or [None] * 5
        mine = rec.whole_end(mine, replayed_start)
        if end[1:] != mine[1:]:
            conflicts.append(f"task {key} end {_short(end[1:])} live, {_short(mine[1:])} replayed")
    prefix = rec.START_PREFIX
    extra = {k[len(prefix) :] for k in fields if k.startswith(prefix)} - set(record.starts)
    if extra:
        missing.append(f"tasks {sorted(extra)} started in replay only")
    live = record.state.to_whole_dict()
    if live != replayed:
        missing.append(f"state {_short(live)} live, {_short(replayed)} replayed")
    if not conflicts and not missing:
        item.live = "equal"
    elif not conflicts and record.status == rec.RUNNING and _older(record.ends, item):
        item.live = BEHIND
    else:
        item.live = "different"
        last = item.inputs[-1][1] if item.inputs else None
        problem = (conflicts + missing)[0]
        item.diverge(last or "", None, f"workflow {item.workflow}: live differs: {problem}")


_TASK = frozenset(rec.COMPACTED_PREFIXES)


def _removed_on_time(client: redis.Redis, keys: Keys, item: WorkflowReplay) -> bool:
    """Whether ``item`` ended long enough ago for retention to have removed it, by the
    retention the lifecycle workers last recorded (none recorded: Redis lost it)."""
    ended = item.fields.get(rec.ENDED)
    if item.state is None or item.state.status not in rec.ENDED_STATES or ended is None:
        return False
    retain = client.get(keys.retention)
    if not retain or int(retain) <= 0:
        return False
    seconds, micros = client.time()
    return int(ended) + int(retain) <= seconds * 1000 + micros // 1000


def _older(live_ends: dict[str, Any], item: WorkflowReplay) -> bool:
    """Whether the replay holds every task end live holds (live agreed with each one)."""
    prefix = rec.END_PREFIX
    return set(live_ends) <= {k[len(prefix) :] for k in item.fields if k.startswith(prefix)}
