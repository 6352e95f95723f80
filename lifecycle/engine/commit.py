"""What one advance of one workflow writes: plain commands for a watched transaction,
or the arguments of one ``advance.lua`` call.

Built by :mod:`lifecycle.engine.transition` as the machine's actions are carried out;
:mod:`lifecycle.engine.advance` sends it, replay reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson

from flowlang.machine import State
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.keys import Keys
from lifecycle.stored_state import state_from_fields
from rqse.fastpipe import Template

__all__ = [
    "ADMITTED_FIELDS", "BatchResult", "Commit", "Pending", "Said", "SharedKeys", "SharedWrites",
    "decoded_concurrency", "recorded_inputs", "shared_keys",
]  # fmt: skip

_dumps = orjson.dumps
NO_INPUTS: dict[str, Any] = {}  # shared, never written: Pending.inputs is replaced
# What the gate's own start-tasks carry besides the held ones' fields (events.ADMITTED).
ADMITTED_FIELDS = (ev.ADMITTED, b"true")


@dataclass
class BatchResult:
    committed: int = 0  # workflows advanced
    duplicates: list[str] = field(default_factory=list)  # event ids that changed nothing
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (event id, reason)
    conflicts: int = 0  # recomputations after another worker won
    # event ids XACKed by the advance: committed events, and those that changed nothing
    # acknowledged in the same transaction
    acknowledged: list[str] = field(default_factory=list)


class Said:
    """What computing one workflow said of its events: kept apart until its commit wins."""

    __slots__ = ("duplicates", "rejected")

    def __init__(self) -> None:
        self.duplicates: list[str] = []
        self.rejected: list[tuple[str, str]] = []

    def into(self, result: BatchResult) -> None:
        if self.duplicates:
            result.duplicates += self.duplicates
        if self.rejected:
            result.rejected += self.rejected


class Pending:
    """One workflow's events in this batch and what they produce.

    A plain slotted class: one is made per workflow per batch."""

    __slots__ = (
        "workflow", "events", "version", "state", "digest", "inputs", "salt", "corrupt", "refused",
        "held", "resends", "entries", "input_keys", "priority", "concurrency", "key",
        "compacted", "created",
    )  # fmt: skip

    def __init__(
        self, workflow: str, events: list[tuple[str, str, Any]], version: str = ""
    ) -> None:
        self.workflow = workflow
        self.events = events  # (event id, kind, parsed event)
        self.version = version
        self.state: State | None = None
        self.digest: str | None = None
        self.inputs: dict[str, Any] = NO_INPUTS  # task inputs loaded for retries
        # the secret of its attempt tokens (lifecycle.events.task_token); None for workflows
        # stored before tokens, whose end-tasks are not checked
        self.salt: str | None = None
        self.priority = 0  # lifecycle.priorities: the stream of each kind its tasks go to
        self.corrupt: str | None = None  # why its stored record could not be read
        self.refused: str | None = None  # why Redis refused its commit (the script raised)
        # while paused: the keys of the task instances whose start-tasks are held, in order
        self.held: list[str] | None = None
        # a resume or restart is among its events: inputs of start-tasks sent in this
        # batch are kept (note_input), as it may send them again
        self.resends = False
        self.entries: list[str] = []  # the fields of a chunked state's entries to load
        self.input_keys: list[str] = []  # task instances whose inputs are loaded with it
        # under a concurrency key: its record's CONCURRENCY field, decoded (shared by the
        # records of the same value: replaced, never changed in place)
        self.concurrency: dict[str, Any] | None = None
        # its record's key, encoded, when the advancer read it: its plain step writes there
        self.key: bytes | None = None
        # no hash, but an entry of Keys.compacted: it finished (state is a finished one)
        self.compacted = False
        # its record's CREATED (ms): its task records' times count from there
        # (records.record_offset); None without one
        self.created: int | None = None

    def note_input(self, key: str, value: Any) -> None:
        """The input of a start-task held or sent in this batch: a resume or restart later
        in the same batch sends it (what was loaded before the batch does not have it)."""
        if self.inputs is NO_INPUTS:
            self.inputs = {}
        self.inputs[key] = value

    def read_fields(self, fields: Mapping[Any, Any]) -> None:
        """Fill in what is stored of the workflow from its hash fields (names and values as
        bytes or str): version, state, graph, salt, pause, and the inputs of every task
        instance (what a restart or a resume sends again)."""
        get = _getter(fields)
        version, state, digest, salt = (get(name) for name in _RECORD)
        paused = get(rec.PAUSED)
        concurrency = get(rec.CONCURRENCY)
        self.concurrency = decoded_concurrency(concurrency) if concurrency is not None else None
        self.version = _text(version) if version else ""
        self.state = state_from_fields(fields) if state else None
        self.digest = _text(digest) if digest else None
        self.salt = _text(salt) if salt is not None else None
        self.held = orjson.loads(paused) if paused is not None else None
        priority = get(rec.PRIORITY)
        self.priority = int(priority) if priority is not None else 0
        self.created = rec.created_ms(get(rec.CREATED))
        self.corrupt = None
        self.inputs = recorded_inputs(fields)


@lru_cache(maxsize=1024)  # a few values stand for all: a key's workflows share theirs
def decoded_concurrency(raw: bytes | str) -> dict[str, Any]:
    """A record's CONCURRENCY field decoded, the same dict for the same value."""
    value = orjson.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"its concurrency field is not an object: {raw!r}")
    return value


def recorded_inputs(fields: Mapping[Any, Any]) -> dict[str, Any]:
    """The input of every task instance recorded in a workflow's hash fields, by key."""
    inputs = {}
    for name, value in fields.items():
        text = _text(name)
        if text.startswith(rec.START_PREFIX):
            inputs[text[len(rec.START_PREFIX) :]] = orjson.loads(value)[2]
    return inputs


_RECORD = (rec.VERSION, rec.STATE, rec.GRAPH, rec.SALT)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _getter(fields: Mapping[Any, Any]) -> Any:
    def get(name: str) -> Any:
        value = fields.get(name)
        return fields.get(name.encode()) if value is None else value

    return get


SharedKeys = tuple[str, str, str, str, str, str]


def shared_keys(keys: Keys) -> SharedKeys:
    """KEYS[2…7] of every advance.lua call: built once per advancer, not per commit."""
    return (
        keys.lifecycle, keys.timers, keys.workflows, keys.outcomes, keys.expiring, keys.stopped
    )  # fmt: skip


class SharedWrites:
    """The writes of many commits to the keys every workflow shares, gathered to go as one
    command per key (and per outcome) at the end of their transaction: the same effect as
    each commit's own, in a few commands instead of a few per workflow."""

    def __init__(self, shared: SharedKeys) -> None:
        self.shared = shared
        self.timers: list[Any] = []
        self.cancels: list[str] = []
        self.created: list[Any] = []
        self.outcomes: dict[str, int] = {}
        self.expiring: list[Any] = []
        self.stopped: list[Any] = []
        self.unstopped: list[str] = []

    def add(self, commit: Commit) -> None:
        workflow = commit.workflow
        if commit.timers:
            self.timers += commit.timers
        if commit.cancels:
            self.cancels += commit.cancels
        if commit.created:
            self.created += (commit.created, workflow)
        if commit.outcome:
            self.outcomes[commit.outcome] = self.outcomes.get(commit.outcome, 0) + 1
        if commit.expire_at:
            self.expiring += (commit.expire_at, workflow)
        if commit.stopped:
            self.stopped += (workflow, commit.stopped)
        elif commit.unstop:
            self.unstopped.append(workflow)

    def commands(self) -> list[Any]:
        _, timers, workflows, outcomes, expiring, stopped = self.shared
        commands: list[Any] = []
        if self.timers:
            commands.append(("ZADD", timers, *self.timers))
        if self.cancels:
            commands.append(("ZREM", timers, *self.cancels))
        if self.created:
            commands.append(("ZADD", workflows, *self.created))
        for outcome, count in self.outcomes.items():
            commands.append(("HINCRBY", outcomes, outcome, count))
        if self.expiring:
            commands.append(("ZADD", expiring, *self.expiring))
        if self.stopped:
            commands.append(("HSET", stopped, *self.stopped))
        if self.unstopped:
            commands.append(("HDEL", stopped, *self.unstopped))
        return commands


# A pack holds at most this many start-tasks and bytes: one worker runs a pack's tasks in
# turn, so a fan-out of thousands still reaches several workers, and no pack nears a
# listener's largest entry (8 MB by default). A task larger than that goes alone.
PACK_TASKS = 200
PACK_BYTES = 1 << 20


class StartPacks:
    """The start-tasks of a transaction's commits to the streams of packed kinds, gathered
    into ``start-tasks`` entries (lifecycle.events.START_TASKS): one XADD per stream and
    :data:`PACK_TASKS` tasks instead of one per task. Each pack remembers which commits
    it holds tasks of: a refusal of its XADD is theirs."""

    def __init__(self, packed: Callable[[str], bool]) -> None:
        """``packed``: whether a stream's start-tasks are packed."""
        self._packed = packed
        self._open: dict[str, tuple[list[bytes], set[int], list[int]]] = {}
        self._closed: list[tuple[str, list[bytes], set[int]]] = []

    def add(self, owner: int, stream: str, values: tuple[bytes, ...], template: Template) -> bool:
        """Take the start-task ``template`` fills with ``values`` into its stream's pack,
        for commit number ``owner``; False when it goes alone (its stream is not packed,
        its node's tasks never are, or it is larger than a pack may be)."""
        piece = getattr(template, "piece", None)
        if piece is None or not self._packed(stream):
            return False
        task = piece % values
        if len(task) > PACK_BYTES:
            return False
        pack = self._open.get(stream)
        if pack is not None and pack[2][0] + len(task) > PACK_BYTES:
            self._close(stream)
            pack = None
        if pack is None:
            pack = self._open[stream] = ([], set(), [0])
        pieces, owners, size = pack
        pieces.append(task)
        owners.add(owner)
        size[0] += len(task) + 1
        if len(pieces) >= PACK_TASKS:
            self._close(stream)
        return True

    def _close(self, stream: str) -> None:
        pieces, owners, _ = self._open.pop(stream)
        self._closed.append((stream, pieces, owners))

    def commands(self) -> tuple[list[Any], list[set[int]]]:
        """One XADD per pack, and the commits each holds tasks of, in the same order."""
        packs = [*self._closed, *((s, p, o) for s, (p, o, _) in self._open.items())]
        commands = [
            ("XADD", stream, "*", *ev.start_tasks_fields(pieces)) for stream, pieces, _ in packs
        ]
        return commands, [owners for _, _, owners in packs]


class Commit:
    """One workflow's transition, built up as actions are carried out: the arguments of
    one advance.lua call (:meth:`script_call`) or the same writes as plain commands for a
    watched transaction (:meth:`commands`)."""

    __slots__ = (
        "keys", "workflow", "shared", "acks", "fields", "events", "timers", "cancels",
        "created", "outcome", "removed", "expire_at", "stopped", "unstop", "reopened", "deleted",
        "gate", "gate_key", "offer", "offer_timers", "offer_admitted", "plain",
    )  # fmt: skip

    def __init__(self, keys: Keys, workflow: str, shared: SharedKeys | None = None) -> None:
        self.keys = keys
        self.workflow = workflow
        self.shared = shared or shared_keys(keys)
        self.acks: list[str] = []
        self.fields: list[Any] = []
        # (stream, fields, None) or (stream, slot values, the Template to fill)
        self.events: list[tuple[str, Any, Template | None]] = []
        self.timers: list[Any] = []
        self.cancels: list[str] = []
        self.created = ""
        self.outcome = ""  # the status the workflow ended with, when this commit ends it
        self.removed: list[str] = []  # hash fields to delete
        # ms: retention's next step for the workflow this commit ends: its removal, or the
        # compaction of its task records (then rec.EXPIRES holds when it is removed)
        self.expire_at = ""
        # It ended failed or terminated: JSON {key: attempt} of the attempts it stopped, for
        # Keys.stopped (workers skip their queued start-tasks; {} = every one)
        self.stopped: bytes | str = ""
        self.unstop = False  # it finished after a restart: its stop record goes
        self.reopened = False  # restarted: no longer due for removal
        self.deleted = False  # the workflow's record goes (its acks still happen)
        # Under a concurrency key: (key, max running), and what the commit does there:
        # 'enter' (queued at an order) and 'leave' (ended), flat: op, order, ...
        self.gate_key: tuple[str, int] | None = None
        self.gate: list[Any] = []
        # Queued by this commit, its start-tasks held: what the gate sends and writes if it
        # admits the workflow in this commit's own transaction (the common case: nobody
        # waits, there is room): the start-tasks (as in events), their timeout timers
        # (score, member, ...) and its CONCURRENCY value once admitted. None: no offer.
        self.offer: list[tuple[str, Any, Template | None]] | None = None
        self.offer_timers: list[Any] = []
        self.offer_admitted = b""
        # All it writes is its record's fields and start-tasks from their templates (the
        # transition's plain step says so): a watched transaction packs it without the
        # general walk of :meth:`commands`, its fields as an HSET template (packed but for
        # the key and the values) and the values to fill it with.
        self.plain: tuple[Template, tuple[bytes, ...]] | None = None

    def enter(self, key: str, max_running: int, order: int) -> None:
        """The workflow waits in line for its concurrency key from this commit on."""
        self.gate_key = (key, max_running)
        self.gate += ("enter", order)

    def leave(self, key: str, max_running: int) -> None:
        """The workflow ended: its place under its concurrency key goes to the next."""
        self.gate_key = (key, max_running)
        self.gate += ("leave", 0)

    def written_version(self) -> Any:
        """The version this commit writes ('' when it writes none)."""
        names = self.fields[::2]
        if rec.VERSION not in names:
            return ""
        return self.fields[2 * (len(names) - 1 - names[::-1].index(rec.VERSION)) + 1]

    def written_fields(self) -> list[Any]:
        """:attr:`fields` as the commit writes them. With an offer, the workflow as the
        gate admits it (its CONCURRENCY value admitted, no held list): the common case,
        so the gate writes nothing more then; when it does not admit it, it writes the
        queued form (:meth:`queued_fields`) after these."""
        if self.offer is None:
            return self.fields
        fields, admitted = self.fields, self.offer_admitted
        written: list[Any] = []
        for at in range(0, len(fields), 2):
            name = fields[at]
            if name == rec.CONCURRENCY:
                written += (name, admitted)
            elif name != rec.PAUSED:
                written += (name, fields[at + 1])
        return written

    def queued_fields(self) -> tuple[Any, Any]:
        """The CONCURRENCY and held-list (PAUSED) values of an offered workflow the gate
        does not admit: those the transition wrote (the last of each)."""
        concurrency = held = None
        fields = self.fields
        for at in range(0, len(fields), 2):
            if fields[at] == rec.CONCURRENCY:
                concurrency = fields[at + 1]
            elif fields[at] == rec.PAUSED:
                held = fields[at + 1]
        assert concurrency is not None and held is not None, "an offer is of a queued workflow"
        return concurrency, held

    def set(self, name: str, value: Any) -> None:
        self.fields += (name, value)

    def delete(self) -> None:
        """The workflow's record goes: whatever this commit was to write to it, too (the
        events it sends and its acknowledgements stay). advance.lua and :meth:`commands`
        delete before they write, so a start later in the same batch writes the id anew."""
        self.deleted = True
        self.fields, self.removed, self.timers = [], [], []
        self.created, self.expire_at, self.stopped = "", "", ""
        self.unstop = self.reopened = False

    def end(self, now: int, status: str) -> None:
        """The workflow ends with this commit: its end time, and one more of ``status``."""
        self.set(rec.ENDED, now)
        self.outcome = status

    def append(self, stream: str, event: dict[str, Any]) -> None:
        fields: list[Any] = []
        for name, value in event.items():
            fields += (name, _dumps(value))
        self.append_encoded(stream, fields)

    def append_encoded(self, stream: str, fields: list[Any]) -> None:
        """An event already on the wire format: field names and JSON values, alternating."""
        self.events.append((stream, fields, None))

    def append_filled(self, stream: str, template: Template, values: tuple[bytes, ...]) -> None:
        """An event as ``XADD stream * <fields>`` from ``template`` (the start-tasks of one
        node share everything but a few values): packed by one fill in a transaction."""
        self.events.append((stream, values, template))

    def encoded_events(self) -> Iterator[tuple[str, list[Any]]]:
        """(stream, [name, JSON value, ...]) of every event to append, in order."""
        return _encoded(self.events)

    def offered_events(self) -> Iterator[tuple[str, list[Any]]]:
        """(stream, [name, JSON value, ...]) of each start-task the gate sends should it
        admit the workflow in this commit's transaction (none without an offer)."""
        for stream, fields in _encoded(self.offer or []):
            yield stream, [*fields, *ADMITTED_FIELDS]

    def commands(
        self, shared: SharedWrites | None = None, packs: StartPacks | None = None, owner: int = 0
    ) -> list[Any]:
        """The writes of :meth:`script_call` as plain commands (or packed ones), for a
        MULTI/EXEC whose WATCH stands for the version check. Acknowledgements excluded:
        the caller sends one XACK for all the commits of a transaction. With ``shared``,
        the writes to keys every workflow shares (index, counters, schedules) are added
        to it instead, to go as one command each for the whole transaction; with
        ``packs``, the start-tasks to packed streams go into their packs, as commit
        number ``owner``'s."""
        if shared is not None:
            return self._own_commands(shared, packs, owner)
        mine = SharedWrites(self.shared)
        return self._own_commands(mine) + mine.commands()

    def plain_commands(self) -> list[Any]:
        """:meth:`commands` of a :attr:`plain` commit: one HSET, then its start-tasks."""
        assert self.plain is not None
        hset, values = self.plain
        commands: list[Any] = [hset.fill(*values)]
        for _, values, template in self.events:
            commands.append(template.fill(*values))  # type: ignore[union-attr]
        return commands

    def _own_commands(
        self, shared: SharedWrites, packs: StartPacks | None = None, owner: int = 0
    ) -> list[Any]:
        key = self.keys.workflow(self.workflow)
        commands: list[Any] = []
        if self.deleted:  # first: a start later in the same batch writes the id anew
            _, _, workflows, _, expiring, stopped = self.shared
            commands += [
                ("DEL", key),
                ("ZREM", workflows, self.workflow),
                ("ZREM", expiring, self.workflow),
                ("HDEL", stopped, self.workflow),
                ("HDEL", self.keys.compacted, self.workflow),
            ]
        if self.fields:
            commands.append(("HSET", key, *self.written_fields()))
        if self.removed:
            commands.append(("HDEL", key, *self.removed))
        for stream, fields, template in self.events:
            if template is None:
                commands.append(("XADD", stream, "*", *fields))
            elif packs is None or not packs.add(owner, stream, fields, template):
                commands.append(template.fill(*fields))
        if self.reopened:
            commands.append(("ZREM", self.shared[4], self.workflow))
        shared.add(self)
        return commands

    def script_call(self, group: str, version: str) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of one advance.lua call: the workflow and the shared keys; the
        streams events go to are named with the events (the script's header says why)."""
        keys = [self.keys.workflow(self.workflow), *self.shared, self.keys.compacted]
        events: list[Any] = []
        for stream, event_fields in self.encoded_events():
            events += (stream, len(event_fields) // 2, *event_fields)
        fields = self.written_fields()
        return keys, [
            group,
            version,
            rec.VERSION,
            self.workflow,
            "1" if self.deleted else "",
            len(self.acks),
            *self.acks,
            len(fields) // 2,
            *fields,
            len(self.removed),
            *self.removed,
            len(self.events),
            *events,
            len(self.timers) // 2,
            *self.timers,
            len(self.cancels),
            *self.cancels,
            self.created,
            self.outcome,
            self.expire_at,
            self.stopped,
            "1" if self.unstop else "",
            "1" if self.reopened else "",
        ]


def _encoded(
    events: list[tuple[str, Any, Template | None]],
) -> Iterator[tuple[str, list[Any]]]:
    for stream, fields, template in events:
        yield stream, (template.unpacked(*fields)[3:] if template else fields)
