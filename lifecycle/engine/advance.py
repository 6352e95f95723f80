"""Advance workflows from a batch of lifecycle events: load, compute, commit atomically.

The I/O around :class:`lifecycle.transition.Transition`: for each workflow in
the batch, load its version, state, graph and token salt (one pipelined round
trip for the whole batch, under WATCH), compute its transition, then commit —
new state, task instance records, start-task events, timers and the
acknowledgement of the events — as one MULTI/EXEC for the whole batch, or,
after another worker advanced one of its workflows in between (EXEC refused,
nothing written), workflow by workflow with ``advance.lua``, which first checks
the version. A workflow that loses a race is recomputed from fresh state.
Duplicate and stale events change nothing, so redelivery after a crash is
harmless. A workflow whose stored record cannot be read fails alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from itertools import repeat
from typing import Any

import orjson
import redis

from flowlang.limits import DEFAULT_LIMITS, Limits
from flowlang.machine import ChunkedState, Machine, Missing, State
from flowlang.state import FANIN, WAITING, Entry
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.engine.commit import (
    NO_INPUTS,
    BatchResult,
    Commit,
    Pending,
    Said,
    SharedWrites,
    StartPacks,
    decoded_concurrency,
    shared_keys,
)
from lifecycle.engine.gate import gate_packed
from lifecycle.engine.store import GraphCache
from lifecycle.engine.transition import Transition
from lifecycle.errors import BadEvent, LifecycleError
from lifecycle.keys import RESOURCE_KIND, WAIT_KIND, Keys
from lifecycle.priorities import stream_kind
from lifecycle.stored_state import CHUNKED, entry_field, partial_state
from rqse import fastpipe, lua
from rqse.weather import is_weather

__all__ = ["Advancer", "BatchResult", "Commit", "Pending"]

log = logging.getLogger(__name__)

_SCRIPTS = lua.scripts_dir(__file__)
_MAX_CONFLICTS = 50
_MAX_LOADS = 4  # loads of a chunked state's entries for one transition, before all of it
_KNOWN_CHUNKED = 65536  # workflows remembered as chunked (their entries are loaded at once)
_SHARED = frozenset({FANIN, WAITING})  # entries many events of one workflow touch
_SHARED_ENTRIES = 64  # of those, remembered per workflow
# Kinds whose tasks ``pack_starts=True`` leaves unpacked: a wait's worker reads start-tasks
# alone; a resource's tasks (HTTP, files) are slow, better spread over many workers.
_BUILT_IN = frozenset({WAIT_KIND, RESOURCE_KIND})
_LOADED = (
    rec.VERSION, rec.STATE, rec.GRAPH, rec.SALT, rec.PAUSED, rec.PRIORITY, rec.CONCURRENCY,
    rec.CREATED,
)  # fmt: skip
# Events that send start-tasks again (or held ones), with the inputs recorded: the whole
# record is read.
_WHOLE_RECORD = frozenset({ev.RESUME_WORKFLOW, ev.RESTART_WORKFLOW, ev.ADMIT_WORKFLOW})
_LOADED_COUNT = len(_LOADED)
_LOAD = fastpipe.Template("HMGET", fastpipe.SLOT, *_LOADED)
_NO_RECORD = (None,) * _LOADED_COUNT  # the HMGET of _LOADED where the id holds nothing
_NOTHING_SAID = Said()  # what a plain step says of its event besides its commit (never written)


def pack_kinds(pack_starts: bool | Collection[str]) -> frozenset[str] | None:
    """The kinds ``pack_starts`` packs (None: every kind but the built-in ones, ``wait`` and
    ``resource``); ValueError for ``wait``, whose worker takes its start-tasks one by one."""
    if pack_starts is True:
        return None
    if isinstance(pack_starts, str):  # a kind's name is not the collection of its letters
        raise ValueError(f"pack_starts: a collection of kinds, got the string {pack_starts!r}")
    kinds = frozenset(pack_starts or ())
    if WAIT_KIND in kinds:
        raise ValueError(f"the built-in {WAIT_KIND!r} kind's start-tasks are not packed")
    return kinds


def _ms() -> int:
    return int(time.time() * 1000)


def _is_noscript(reply: Any) -> bool:
    return isinstance(reply, redis.exceptions.NoScriptError)


def _workflow_error(reply: Any) -> bool:
    """A script error caused by one workflow, not by the state of Redis (weather)."""
    return isinstance(reply, redis.ResponseError) and not (
        is_weather(reply) or isinstance(reply, redis.exceptions.NoScriptError)
    )


def _raise_errors(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    return replies


def _keys_needing_input(item: Pending) -> list[str]:
    """Task instances whose input a retry may need: failures, timeouts, retries."""
    end_task = ev.END_TASK
    return [
        event.key
        for _, kind, event in item.events
        if (kind == end_task and not event.success) or kind in (ev.RETRY_TASK, ev.TIMEOUT_TASK)
    ]


class _LoadedGraphs:
    """The graphs a batch's transitions may use, fetched before they run: a transition
    stays free of Redis calls, so a Redis error is never mistaken for a workflow's fault."""

    def __init__(self, cache: GraphCache) -> None:
        self.cache = cache
        self.errors: dict[str, Exception] = {}
        self.machines: dict[str, Machine] = {}  # those loaded for the batch: one lookup each

    def load(self, digests: set[str]) -> None:
        self.errors.clear()
        self.machines = {}
        for digest in digests:
            try:
                self.machines[digest] = self.cache.machine(digest)
            except redis.RedisError:
                raise
            except Exception as error:  # noqa: BLE001 - the workflows using it fail with it
                self.errors[digest] = error

    def machine(self, digest: str) -> Machine:
        found = self.machines.get(digest)
        if found is not None:
            return found
        if self.errors:
            error = self.errors.get(digest)
            if error is not None:
                raise error
        return self.cache.machine(digest)


class Advancer:
    """Turns lifecycle events into committed workflow transitions."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys | None = None,
        clock: Callable[[], int] = _ms,
        limits: Limits = DEFAULT_LIMITS,
        *,
        untokened_answers: bool = False,
        retain_ms: int = 0,
        keep_details_ms: int | None = None,
        pack_starts: bool | Collection[str] = False,
    ) -> None:
        """``pack_starts``: the kinds whose start-tasks go packed, one ``start-tasks``
        entry per stream and transaction (True: every kind but the built-in ``wait`` and
        ``resource``)."""
        self.client = client
        self.keys = keys or Keys()
        self.clock = clock
        self.graphs = _LoadedGraphs(GraphCache(client, self.keys, limits))
        self.transition = Transition(
            self.graphs,
            self.keys,
            limits,
            untokened_answers=untokened_answers,
            retain_ms=retain_ms,
            keep_details_ms=keep_details_ms,
        )
        self.script = lua.load_script(client, "advance", _SCRIPTS)
        self.ack_script = lua.load_script(client, "ack_unchanged", _SCRIPTS)
        self._shared = shared_keys(self.keys)
        # Workflows last seen with a chunked state, and the entries of theirs that every
        # batch is likely to touch (an iteration's counter, a join's arrival count): with
        # those its events touch, they are loaded with the record, not after a first try
        # finds them missing.
        self._chunked: dict[str, list[str]] = {}
        self._max_items = limits.items
        self._pack_kinds = pack_kinds(pack_starts)
        self._packing = self._pack_kinds is None or bool(self._pack_kinds)
        self._packed_streams: dict[str, bool] = {}
        self._packs: dict[str, set[str]] = {}  # end-tasks entry id -> its answers' workflows
        self._deferred: set[str] = set()  # of those, the ones the caller acknowledges

    def apply(self, entries: list[tuple[str, dict[str, Any]]]) -> BatchResult:
        """Apply lifecycle events (entry id, decoded event). The caller acknowledges
        ``duplicates`` and dead-letters ``rejected``; the ids in ``acknowledged`` (committed
        events, and duplicates acknowledged with them) are acknowledged here."""
        result = BatchResult()
        self._packs = {}
        pending = self._group(entries, result)
        # End-tasks entries acknowledged only once all their answers are: not by the
        # transaction or script of any one workflow (see _group_packed).
        deferred = self._deferred = set()
        rounds = 0
        while pending:
            # The first round commits the whole batch in one MULTI/EXEC under WATCH of its
            # workflows: plain commands, a third of the script's cost in Redis. If another
            # worker advanced any of them meanwhile nothing is written, and the next rounds
            # commit workflow by workflow through advance.lua's version check, so one
            # contended workflow never holds back the rest of a batch twice.
            watched = rounds == 0
            with fastpipe.session(self.client) as send:
                self._load(pending, send, watch=watched)
                commits = []
                quiet = []  # workflows whose events change nothing: (item, what was said)
                now = self.clock()  # one reading per round: its records share a time
                plain_step = self.transition.plain_step
                for item in pending:
                    commit = plain_step(item, now)  # the common item, at its least cost
                    if commit is not None:
                        commits.append((item, commit, _NOTHING_SAID))
                        continue
                    # A workflow that loses the race is recomputed from fresh state: what
                    # this round said of its events counts only if the round's commit wins.
                    commit, said = self._compute(item, now, send)
                    if commit is None:
                        quiet.append((item, said))
                    else:
                        commits.append((item, commit, said))
                if watched:
                    # Events that change nothing are acknowledged in the same transaction
                    # (not in a round trip of their own) when it wins; so are those of
                    # the workflows they change nothing of, as judged under the WATCH (a
                    # start judged a duplicate of a workflow a delete removes meanwhile
                    # is judged again). A workflow known by its compacted entry is not
                    # under the WATCH: its judgement is confirmed after.
                    covered = [(item, said) for item, said in quiet if not item.compacted]
                    extra = (
                        result.duplicates
                        + [d for _, said in covered for d in said.duplicates]
                        + [d for _, _, said in commits for d in said.duplicates]
                    )
                    if self._packs:
                        # A pack goes with this transaction when all its answers do.
                        resolved = {item.workflow for item, _, _ in commits}
                        resolved.update(item.workflow for item, _ in covered)
                        deferred = self._deferred = {
                            pack
                            for pack, workflows in self._packs.items()
                            if not workflows <= resolved
                        }
                    won_all = self._commit_watched(
                        [commit for _, commit, _ in commits], extra, send
                    )
                    outcome: Sequence[bool | redis.ResponseError] = won_all or [False] * len(
                        commits
                    )
                    if won_all is None:
                        pending = [item for item, _ in quiet]
                        result.conflicts += len(pending)
                        # nothing written: each pack waits for all its answers
                        deferred = self._deferred = set(self._packs)
                    else:
                        result.acknowledged += extra
                        for _, said in covered:
                            said.into(result)
                        compacted = [(item, said) for item, said in quiet if item.compacted]
                        pending = self._confirm_quiet(compacted, send, result)
                else:
                    pending = self._confirm_quiet(quiet, send, result)
            if not watched:
                outcome = self._commit([(item, commit) for item, commit, _ in commits])
            for (item, commit, said), won in zip(commits, outcome, strict=True):
                if isinstance(won, redis.ResponseError):
                    if item.refused is None:  # fail the workflow alone, with the reason
                        item.refused = f"Redis refused its commit: {won}"
                        pending.append(item)
                    else:  # even its failure cannot be written: leave it, refuse its events
                        log.error(
                            "workflow %s: %s; its failure: %s", item.workflow, item.refused, won
                        )
                        result.rejected += [(i, item.refused) for i, _, _ in item.events]
                    continue
                if won:
                    if said.duplicates or said.rejected:
                        said.into(result)
                    result.acknowledged += commit.acks
                    result.committed += 1
                else:
                    pending.append(item)
                    result.conflicts += 1
            if watched and self._packs and pending:
                # A pack with an answer still to commit waits for it (after a refusal
                # Redis already acknowledged it with the rest: see _group_packed).
                again = {item.workflow for item in pending}
                deferred.update(p for p, w in self._packs.items() if not w.isdisjoint(again))
            rounds += 1
            if rounds > _MAX_CONFLICTS and pending:
                raise LifecycleError(
                    f"workflow {pending[0].workflow}: gave up after {rounds} conflicts"
                )
        if deferred:
            # Every answer of these packs is in: the caller acknowledges them. A crash
            # before it redelivers them, their answers then judged as already applied.
            result.acknowledged = [i for i in result.acknowledged if i not in deferred]
            result.duplicates += sorted(deferred)
        return result

    # -- steps -------------------------------------------------------------------

    def _confirm_quiet(
        self,
        quiet: list[tuple[Pending, Said]],
        send: fastpipe.Send,
        result: BatchResult,
    ) -> list[Pending]:
        """What was said of the events of workflows they change nothing of, judged outside
        a WATCH, counts if each workflow is still as it was read (ack_unchanged.lua, which
        then acknowledges its duplicates): the workflows changed meanwhile are returned,
        to be judged again. As strict as the WATCH (any commit since the read, not only a
        delete): a resume refused as the workflow was not paused must be judged again
        when a pause sent before it commits meanwhile."""
        if not quiet:
            return []
        keys, group, sha = self.keys, self.keys.lifecycle_group, self.ack_script.sha
        deferred = self._deferred
        calls = [
            (
                "EVALSHA",
                sha,
                3,
                keys.workflow(item.workflow),
                keys.lifecycle,
                keys.compacted,
                group,
                item.version,
                rec.VERSION,
                item.workflow,
                "1" if item.compacted else "0",
                *(d for d in said.duplicates if d not in deferred),
            )
            for item, said in quiet
        ]
        replies = send(calls)
        if any(_is_noscript(reply) for reply in replies):  # after a restart or SCRIPT FLUSH
            self.client.script_load(lua.script_source("ack_unchanged", _SCRIPTS))
            replies = send(calls)
        again = []
        for (item, said), unchanged in zip(quiet, _raise_errors(replies), strict=True):
            if unchanged:
                result.acknowledged += said.duplicates
                said.into(result)
            else:
                again.append(item)
                result.conflicts += 1
        return again

    def _compute(self, item: Pending, now: int, send: fastpipe.Send) -> tuple[Commit | None, Said]:
        """``item``'s transition; a chunked state's entries it finds missing are loaded and
        it is computed again (after a few tries, on the whole state)."""
        for loads in range(_MAX_LOADS + 1):
            said = Said()
            try:
                return self.transition.compute(item, said, now), said
            except Missing as missing:
                wanted = missing.wanted if loads + 1 < _MAX_LOADS else None
                self._load_more(item, wanted, send)
        # Whole, and still missing what its entries say it holds: the record is corrupt.
        item.state, item.corrupt = None, "its state lacks entries its own counts name"
        said = Said()
        return self.transition.compute(item, said, now), said

    def _group(
        self, entries: list[tuple[str, dict[str, Any]]], result: BatchResult
    ) -> list[Pending]:
        by_workflow: dict[str, Pending] = {}
        parse_end_task, end_task_kind, parse_input = ev.parse_end_task, ev.END_TASK, ev.parse_input
        admission_sent, admit = ev.admission_sent, ev.ADMIT_WORKFLOW
        end_tasks_kind = ev.END_TASKS
        for event_id, event in entries:
            kind = event.get("kind")
            if kind == end_tasks_kind:
                self._group_packed(event_id, event, by_workflow, result, self._packs)
                continue
            if kind == admit and admission_sent(kind, event):  # (no call for the others)
                # The gate carried it out in the commit that wrote it: acknowledged as one
                # that changes nothing, with no read (replay applies it, to the same effect).
                result.duplicates.append(event_id)
                continue
            try:
                if kind == end_task_kind:
                    parsed: Any = parse_end_task(event_id, event)
                else:
                    parsed = parse_input(event_id, kind, event)
            except BadEvent as error:
                result.rejected.append((event_id, str(error)))
                continue
            if parsed is None:
                result.duplicates.append(event_id)  # not a lifecycle input: nothing to do
                continue
            workflow = parsed.workflow
            item = by_workflow.get(workflow)
            if item is None:
                item = by_workflow[workflow] = Pending(workflow, [])
            item.events.append((event_id, str(kind), parsed))
        return list(by_workflow.values())

    @staticmethod
    def _group_packed(
        event_id: str,
        event: dict[str, Any],
        by_workflow: dict[str, Pending],
        result: BatchResult,
        packs: dict[str, set[str]],
    ) -> None:
        """An ``end-tasks`` entry: each answer grouped under its workflow as an end-task
        of its own, all under the entry's id (``packs``: the id's workflows).

        The id is acknowledged by the round-one transaction when all its workflows are
        in it, else by the caller once every one committed (apply()'s ``deferred``). A
        commit Redis refuses for its workflow's sake in round one has the pack
        acknowledged with the rest of that transaction (EXEC does not roll back): that
        workflow is failed, with the reason, in a later round, so its answer no longer
        matters. A malformed answer dead-letters the entry, with the reason; its other
        answers are applied (a requeue of the entry changes nothing of theirs)."""
        try:
            parts, bad = ev.parse_end_tasks(event_id, event)
        except BadEvent as error:
            result.rejected.append((event_id, str(error)))
            return
        if bad:
            result.rejected.append((event_id, "; ".join(bad)))
        if not parts:
            if not bad:
                result.duplicates.append(event_id)  # an empty pack: nothing to do
            return
        end_task_kind = ev.END_TASK
        workflows = packs[event_id] = set()
        for parsed in parts:
            workflow = parsed.workflow
            workflows.add(workflow)
            item = by_workflow.get(workflow)
            if item is None:
                item = by_workflow[workflow] = Pending(workflow, [])
            item.events.append((event_id, end_task_kind, parsed))

    def _load(self, pending: list[Pending], send: fastpipe.Send, watch: bool) -> None:
        workflow_key = self.keys.workflow
        names = [workflow_key(item.workflow) for item in pending]
        commands: list[Any] = [("WATCH", *names)] if watch else []
        chunked = self._chunked
        end_task, start, load = ev.END_TASK, ev.START_WORKFLOW, _LOAD.fill
        index, compacted = self.keys.workflows, self.keys.compacted
        starts: list[Pending] = []  # items with a start-workflow among their events
        index_only: set[Pending] = set()  # of those, asked only whether the index lists them
        for item, key in zip(pending, names, strict=True):
            events = item.events
            if len(events) == 1 and chunked.get(item.workflow) is None:
                _, kind, event = events[0]
                if kind == end_task and event.success and "." not in event.key:
                    # The common case, one answer that succeeded: the record's core alone,
                    # as _read_command would say, without its general walk over the events.
                    if item.resends or item.entries or item.input_keys:  # (a round before)
                        item.resends, item.entries, item.input_keys = False, [], []
                    item.key = encoded = key.encode()
                    commands.append(load(encoded))
                    continue
                if kind == start and watch and not event.claimed:
                    # A start alone, most often of a new id: the index lists every id that
                    # has a record or a compacted one (each is written and removed with its
                    # entry, advance.lua's before its record), so one ZSCORE stands for
                    # reading both. The WATCH above guards the record against a start of
                    # the same id elsewhere; a round after a lost race reads it whole.
                    item.resends, item.entries, item.input_keys = False, [], []
                    commands.append(("ZSCORE", index, item.workflow))
                    starts.append(item)
                    index_only.add(item)
                    continue
            item.resends = any(kind in _WHOLE_RECORD for _, kind, _ in events)
            item.entries = _entries_touched(item, chunked.get(item.workflow))
            commands.append(self._read_command(item, key))
            if any(kind == start for _, kind, _ in events):
                starts.append(item)
        # The other starts' ids may be compacted workflows' (no hash, an entry of
        # Keys.compacted): asked in the same round trip, not after the record was read.
        asking = [item for item in starts if item not in index_only] if index_only else starts
        commands += [("HEXISTS", compacted, item.workflow) for item in asking]
        replies = _raise_errors(send(commands))[1 if watch else 0 :]
        asked = dict(zip(asking, replies[len(pending) :], strict=True))
        reads = replies[: len(pending)] if asking else replies
        listed = []  # lone starts of an id the index lists: a duplicate, or a claimed id
        for item, values in zip(pending, reads, strict=True):
            if item in index_only:
                if values is not None:
                    listed.append(item)
                    continue
                values = _NO_RECORD
                asked[item] = 0  # not compacted either: the index lists every compacted id
            self._read(item, values)
            item.compacted = False
        if listed:  # (rare) read as any other start is, in a second round trip
            asked.update(self._read_whole(listed, send))
        gone = [
            item
            for item in pending
            if item.state is None and item.corrupt is None and item not in asked
        ]
        if gone:  # (rare: a late answer or a control for a workflow with no hash)
            found = _raise_errors(send([("HEXISTS", compacted, i.workflow) for i in gone]))
            asked.update(zip(gone, found, strict=True))
        digests: set[str] = set()
        for item in pending:
            if item.state is None and item.corrupt is None and asked.get(item):
                # It finished and was compacted: it takes events as a finished one does.
                item.state, item.compacted = State(status=rec.FINISHED), True
            if item.digest is not None and item.corrupt is None and not item.compacted:
                digests.add(item.digest)
        for item in starts:  # a new run's graph, whatever ran under its id before
            digests.update(event.graph for _, kind, event in item.events if kind == start)
        self.graphs.load(digests)

    def _read_whole(self, items: list[Pending], send: fastpipe.Send) -> dict[Pending, Any]:
        """Read ``items``' records, and ask whether each id names a compacted workflow
        (the HEXISTS reply of each), in one round trip."""
        workflow_key, compacted = self.keys.workflow, self.keys.compacted
        replies = _raise_errors(
            send(
                [self._read_command(item, workflow_key(item.workflow)) for item in items]
                + [("HEXISTS", compacted, item.workflow) for item in items]
            )
        )
        for item, values in zip(items, replies[: len(items)], strict=True):
            self._read(item, values)
            item.compacted = False
        return dict(zip(items, replies[len(items) :], strict=True))

    def _read_command(self, item: Pending, key: str) -> Any:
        if item.resends:  # a resume or restart sends start-tasks again: everything is read
            return ("HGETALL", key)
        # A retry may need the inputs of failed attempts: read with the record.
        inputs = item.input_keys = _keys_needing_input(item)
        if inputs or item.entries:
            return ("HMGET", key, *_LOADED, *map(rec.start_field, inputs), *item.entries)
        return _LOAD.fill(key.encode())

    def _read(self, item: Pending, values: Any) -> None:
        """Fill ``item`` from the read of its record: an HGETALL (resends), or the HMGET
        of ``_LOADED``, then the inputs asked for, then the entries of a chunked state."""
        try:
            if item.resends:
                item.read_fields(_pairs(values))
            else:
                version, state, digest, salt, paused, priority, concurrency, created = values[
                    :_LOADED_COUNT
                ]
                item.version = version.decode() if version else ""
                core = orjson.loads(state) if state else None
                if core is None:
                    item.state = None
                elif CHUNKED in core:
                    loaded = values[_LOADED_COUNT + len(item.input_keys) :]
                    item.state = partial_state(
                        core, zip(item.entries, loaded, strict=True), self._max_items
                    )
                else:
                    item.state = State.from_dict(core)
                item.digest = digest.decode() if digest else None
                item.salt = salt.decode() if salt is not None else None
                item.held = orjson.loads(paused) if paused is not None else None
                item.priority = int(priority) if priority is not None else 0
                item.created = rec.created_ms(created)
                item.concurrency = (
                    decoded_concurrency(concurrency) if concurrency is not None else None
                )
                item.corrupt = None
                inputs = item.input_keys
                if not inputs:
                    item.inputs = NO_INPUTS
                else:
                    raws = values[_LOADED_COUNT : _LOADED_COUNT + len(inputs)]
                    item.inputs = {
                        key: orjson.loads(raw)[2]
                        for key, raw in zip(inputs, raws, strict=True)
                        if raw is not None
                    }
        except Exception as error:  # noqa: BLE001 - a record no reader can use
            item.state, item.corrupt = None, f"its stored record is corrupt: {error}"
            return
        if type(item.state) is ChunkedState:
            chunked = self._chunked
            if item.workflow not in chunked:
                chunked[item.workflow] = []
                if len(chunked) > _KNOWN_CHUNKED:
                    del chunked[next(iter(chunked))]

    def _load_more(
        self, item: Pending, wanted: Sequence[Entry] | None, send: fastpipe.Send
    ) -> None:
        """Read ``item``'s record again with the entries ``wanted`` too (None: all of it),
        for a transition that found them missing: one read, so they match its version."""
        if wanted is None:
            item.resends = True  # read whole, as for a resume
        else:
            fields = [entry_field(entry) for entry in wanted]
            item.entries = [*item.entries, *fields]
            shared = self._chunked.get(item.workflow)
            if shared is not None and len(shared) < _SHARED_ENTRIES:
                shared += [f for f, e in zip(fields, wanted, strict=True) if e[0] in _SHARED]
        command = self._read_command(item, self.keys.workflow(item.workflow))
        self._read(item, _raise_errors(send([command]))[0])
        if wanted is None:
            item.resends = any(kind in _WHOLE_RECORD for _, kind, _ in item.events)

    def _packed(self, stream: str) -> bool:
        """Whether start-tasks to ``stream`` go packed (remembered per stream)."""
        packed = self._packed_streams.get(stream)
        if packed is None:
            kind, kinds = stream_kind(self.keys, stream), self._pack_kinds
            packed = kind not in _BUILT_IN if kinds is None else kind in kinds
            self._packed_streams[stream] = packed
        return packed

    def _commit_watched(
        self,
        commits: list[Commit],
        extra_acks: list[str],
        send: fastpipe.Send,
    ) -> list[bool | redis.ResponseError] | None:
        """All ``commits`` in one MULTI/EXEC on the connection that sent the WATCH, with the
        acknowledgement of their events and of ``extra_acks``: all written (True each, a
        commit one of whose writes Redis refused for that workflow's sake gets the error
        in its place) or, when a watched workflow changed, none (None)."""
        xack = ("XACK", self._shared[0], self.keys.lifecycle_group)
        deferred = self._deferred
        if deferred:
            extra_acks = [i for i in extra_acks if i not in deferred]
        if not commits:
            if not extra_acks:
                _raise_errors(send([("UNWATCH",)]))
                return []
            written = fastpipe.transaction(send, [(*xack, *extra_acks)], raise_errors=False)
            if written is None:
                return None
            _raise_errors(written)
            return []
        commands: list[Any] = []
        sizes = []  # commands per commit: which commit a failed command belongs to
        shared = SharedWrites(self._shared)
        packs = StartPacks(self._packed) if self._packing else None
        append = commands.append
        for n, commit in enumerate(commits):
            if commit.plain is not None:  # (Commit.plain_commands, inline: once per event)
                hset, values = commit.plain
                append(hset.fill(*values))
                size = 1
                for stream, values, template in commit.events:
                    if packs is None or not packs.add(n, stream, values, template):  # type: ignore[arg-type]
                        append(template.fill(*values))  # type: ignore[union-attr]
                        size += 1
                sizes.append(size)
                continue
            own = commit.commands(shared, packs, n)
            commands += own
            sizes.append(len(own))
        # Then the packs of start-tasks: a refusal of one is each of its commits'.
        pack_owners: list[set[int]] = []
        if packs is not None:
            pack_commands, pack_owners = packs.commands()
            commands += pack_commands
        packs_at = len(commands) - len(pack_owners)
        # Then what they do under concurrency keys, in one gate call whose reply holds one
        # reply per section: a section's error is its workflow's, as its writes' are.
        gate = gate_packed(commits, check=False)  # the transaction's WATCH checks them
        gate_at, sections = -1, []
        if gate is not None:
            gate_at = len(commands)
            commands.append(gate)
            sections = [n for n, commit in enumerate(commits) if commit.gate_key is not None]
        # Then the index, counters and schedules of them all: one command each. A refusal
        # of one of these is Redis's trouble, not a workflow's: the batch is retried.
        commands += shared.commands()
        acks = [event_id for commit in commits for event_id in commit.acks]
        if deferred:
            acks = [i for i in acks if i not in deferred]
        if acks or extra_acks:
            commands.append((*xack, *acks, *extra_acks))
        replies = fastpipe.transaction(send, commands, raise_errors=False)
        if replies is None:
            return None
        outcome: list[bool | redis.ResponseError] = [True] * len(commits)
        sections_failed = gate_at >= 0 and (
            not isinstance(replies[gate_at], list)
            or any(map(isinstance, replies[gate_at], repeat(BaseException)))
        )
        if not sections_failed and not any(map(isinstance, replies, repeat(BaseException))):
            return outcome
        # (the commit it belongs to, or None for the shared writes and the XACK, error)
        failed: list[tuple[int | None, BaseException]] = []
        owners = [n for n, size in enumerate(sizes) for _ in range(size)]
        for n, reply in enumerate(replies):
            if n == gate_at or not isinstance(reply, BaseException):
                continue
            if packs_at <= n < packs_at + len(pack_owners):
                failed += [(owner, reply) for owner in sorted(pack_owners[n - packs_at])]
            else:
                failed.append((owners[n] if n < len(owners) else None, reply))
        if gate_at >= 0:
            reply = replies[gate_at]
            if isinstance(reply, BaseException):  # the call failed whole: each section did
                failed += [(n, reply) for n in sections]
            else:
                failed += [
                    (n, error)
                    for n, error in zip(sections, reply, strict=True)
                    if isinstance(error, BaseException)
                ]
        for owner, error in failed:
            if owner is None or not isinstance(error, redis.ResponseError):
                raise error  # a shared write or the acknowledgement: Redis's trouble
            if not _workflow_error(error):
                raise error  # Redis trouble: the batch is retried
            # EXEC does not roll back: the workflow's other writes stand, so it is failed
            # on top of them (recomputed from what is stored, and committed again).
            outcome[owner] = error
        return outcome

    def _commit(self, commits: list[tuple[Pending, Commit]]) -> list[bool | redis.ResponseError]:
        if not commits:
            return []
        deferred = self._deferred
        group = self.keys.lifecycle_group
        commands: list[Any] = []
        gated = []  # where a commit's script call goes with its gate, in a MULTI of its own
        for item, commit in commits:
            if deferred:
                commit.acks = [i for i in commit.acks if i not in deferred]
            keys, args = commit.script_call(group, item.version)
            call = ("EVALSHA", self.script.sha, len(keys), *keys, *args)
            gate = gate_packed([commit])
            if gate is None:
                commands.append(call)
                continue
            gated.append(len(commands))
            # The gate checks the version the script wrote: a lost race admits nothing.
            commands += [("MULTI",), call, gate, ("EXEC",)]
        replies = self._execute_script_calls(commands, gated)
        if any(_is_noscript(reply) for reply in replies):  # after a restart or SCRIPT FLUSH
            self.client.script_load(lua.script_source("advance", _SCRIPTS))
            replies = self._execute_script_calls(commands, gated)
        # Redis trouble (out of memory, read-only, ...) stops the batch, to be retried;
        # an error the script raised for one workflow's data is that workflow's alone.
        _raise_errors([reply for reply in replies if not _workflow_error(reply)])
        return [reply if _workflow_error(reply) else bool(reply) for reply in replies]

    def _execute_script_calls(self, commands: list[Any], gated: list[int]) -> list[Any]:
        """The reply of each commit's script call (those at ``gated`` start a MULTI of
        four commands whose EXEC holds it)."""
        replies = fastpipe.execute(self.client, commands)
        if not gated:
            return replies
        out, at, starts = [], 0, set(gated)
        while at < len(replies):
            if at in starts:
                executed = replies[at + 3]
                if isinstance(executed, BaseException) or executed is None:
                    # Refused whole (EXECABORT): the queuing error says why.
                    errors = [r for r in replies[at : at + 3] if isinstance(r, BaseException)]
                    out.append(errors[0] if errors else executed)
                else:  # the script's reply, unless the commit won and its gate failed
                    gate = executed[1]
                    failed = gate[0] if isinstance(gate, list) else gate
                    won = executed[0] and not isinstance(executed[0], BaseException)
                    out.append(failed if won and isinstance(failed, BaseException) else executed[0])
                at += 4
            else:
                out.append(replies[at])
                at += 1
        return out


def _pairs(reply: Any) -> dict[Any, Any]:
    """An HGETALL reply as a dict, whether the connection decoded it or not."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


def _entries_touched(item: Pending, shared: list[str] | None) -> list[str]:
    """The entry fields a chunked workflow's events read: each task's running attempt, the
    iteration its item belongs to, and the workflow's ``shared`` entries. For a workflow
    not known to be chunked, those of iteration items only (only a chunked state has
    them, unless its flow has a cycle; a field not stored costs a nil)."""
    fields: list[str] = []
    for _, _, event in item.events:
        key = getattr(event, "key", None)
        if key is None or (shared is None and "." not in key):  # most events: nothing
            continue
        item_of = key.rpartition(".")[0]
        if item_of:
            fields += (rec.RUNNING_PREFIX + key, rec.FANIN_PREFIX + item_of)
        else:
            fields.append(rec.RUNNING_PREFIX + key)
    if shared:
        fields += shared
    return fields
