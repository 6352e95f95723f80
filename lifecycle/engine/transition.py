"""The transition: one workflow's stored record plus its events in, what to write out.

Pure: no Redis. :class:`Transition` applies a workflow's lifecycle events, in
order, to the record loaded for it (:class:`~lifecycle.commit.Pending`) with
:class:`flowlang.machine.Machine`, and returns the :class:`~lifecycle.commit.Commit`
that holds every write — new state, task instance records, start-task events,
timers, the acknowledgement of the events. The live lifecycle worker
(:mod:`lifecycle.engine.advance`), replay and recovery all call this one function;
only where the record comes from and where the commit goes differ.

One workflow's data can never stop another's: an error raised while applying
its events (a value past the limits, a corrupt record, a graph that cannot be
loaded, anything its data makes the machine raise) fails that workflow alone,
with the reason, and the event that caused it is dead-lettered with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Protocol

import orjson

from flowlang.errors import FlowError
from flowlang.limits import DEFAULT_LIMITS, Limits, depth_within, encode_value
from flowlang.machine import ChunkedState, Failed, Finished, Machine, Missing, StartTask, State
from flowlang.policy import Policy, split_params
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.engine.commit import BatchResult, Commit, Pending, Said, shared_keys
from lifecycle.errors import LifecycleError
from lifecycle.keys import Keys, task_kind
from lifecycle.stored_state import write_changes
from rqse.fastpipe import SLOT, Template

__all__ = ["GraphSource", "Transition"]

log = logging.getLogger(__name__)

_dumps = orjson.dumps
_ENCODER_DEPTH = 254  # orjson.dumps raises on values nested deeper than this


class GraphSource(Protocol):  # lifecycle.store.GraphCache live; the archive's graphs in replay
    def machine(self, digest: str) -> Machine: ...


@dataclass(frozen=True, slots=True)
class _TaskFacts:
    stream: str
    start_task: Any  # fastpipe.Template of its start-task (lifecycle.events.start_task_template)
    policy: Policy


@dataclass(frozen=True, slots=True)
class _Step:
    """What the plain step of one node needs (Transition.plain_step)."""

    end_field: str  # the node's end record's field
    # per successor: its key, its start record's field, its key as JSON, its stream and
    # its start-task's template
    starts: tuple[tuple[str, str, bytes, str, Any], ...]
    attempts: tuple[tuple[str, int], ...]  # the successors' first attempts
    hset: Template  # the HSET of the step's fields (_plain_hset)


_NOT_PLAIN = _Step("", (), (), Template("HSET"))  # a node the plain step leaves alone


class _EventFailed(Exception):
    """An event failed its workflow: ``reason`` is what the workflow records."""

    def __init__(self, event_id: str, reason: str) -> None:
        super().__init__(reason)
        self.event_id, self.reason = event_id, reason


def _reason(error: BaseException) -> str:
    if isinstance(error, FlowError | LifecycleError):
        return str(error)
    return f"{type(error).__name__}: {error}"


class Transition:
    """Computes workflow transitions from graphs (by content hash) and the deployment's keys."""

    def __init__(
        self,
        graphs: GraphSource,
        keys: Keys | None = None,
        limits: Limits = DEFAULT_LIMITS,
        *,
        untokened_answers: bool = False,
        retain_ms: int = 0,
        keep_details_ms: int | None = None,
    ) -> None:
        """``untokened_answers``: take an end-task that carries no token (task workers
        written for the predecessor system send none); one with a wrong token never is.
        ``retain_ms``: how long a workflow that ended stays before retention removes it
        (0: kept until deleted). ``keep_details_ms``: how long a workflow that finished keeps
        its task records before they are compacted (None: kept)."""
        self.graphs = graphs
        self.keys = keys or Keys()
        self.limits = limits
        self.untokened_answers = untokened_answers
        self.retain_ms = retain_ms
        self.keep_details_ms = keep_details_ms
        self._walk_depth = limits.depth < _ENCODER_DEPTH
        self._shared = shared_keys(self.keys)
        # (graph hash, priority) -> per node
        self._tasks: dict[tuple[str, int], list[_TaskFacts | None]] = {}
        # (graph hash, priority) -> instance key -> what its node's plain step needs
        self._steps: dict[tuple[str | None, int], dict[str, _Step]] = {}

    def compute(self, item: Pending, result: BatchResult | Said, now: int) -> Commit | None:
        """Apply ``item.events`` to ``item.state``; return what to commit, or None when
        nothing changes. Events that change nothing go to ``result.duplicates``, events
        refused (with the reason) to ``result.rejected``."""
        commit = self.plain_step(item, now)
        if commit is not None:
            return commit
        if item.corrupt is not None and any(k == ev.DELETE_WORKFLOW for _, k, _ in item.events):
            return self._delete_corrupt(item, result)
        if item.corrupt is not None or item.refused is not None:
            reason = item.corrupt or item.refused or ""
            return self.failure(item, result, now, item.events[0][0], reason)
        ended = item.state is not None and item.state.status != rec.RUNNING
        try:
            return self._compute(item, result, now)
        except _EventFailed as failed:
            log.debug("workflow %s: %s", item.workflow, failed.reason, exc_info=True)
            if ended:  # it had ended before this batch: record nothing, refuse the event
                result.rejected.append((failed.event_id, failed.reason))
                return None
            return self.failure(item, result, now, failed.event_id, failed.reason)

    def failure(
        self, item: Pending, result: BatchResult | Said, now: int, event_id: str, reason: str
    ) -> Commit:
        """The commit that fails ``item``'s workflow for ``reason``: its state failed, nothing
        left running, a failed-workflow event, every event of the batch acknowledged and the
        one that caused it dead-lettered with the reason. The rest of the batch goes on."""
        state = item.state if item.state is not None and item.corrupt is None else State()
        if type(state) is ChunkedState:
            # Stored whole from now on: its entry fields stay unread until it is removed.
            state = State(output=state.output, started=state.started)
        state.status, state.error = rec.FAILED, reason
        # Not restartable: the state may be half changed by what failed.
        state.running, state.waiting, state.fanin, state.stopped = {}, {}, {}, {}
        item.state = state
        commit = Commit(self.keys, item.workflow, self._shared)
        if not item.version:  # new in this batch: listed like any other workflow
            commit.created = str(now)
            commit.set(rec.CREATED, now)
        if item.held is not None:
            commit.removed.append(rec.PAUSED)
        self._end(commit, now, rec.FAILED, state, item)
        commit.append(self.keys.lifecycle, ev.failed_workflow(item.workflow, reason))
        commit.set(rec.STATE, _dumps(state.to_dict()))
        commit.set(rec.VERSION, int(item.version or 0) + 1)
        commit.acks += [event_id for event_id, _, _ in item.events]
        result.rejected.append((event_id, f"workflow {item.workflow} failed: {reason}"))
        return commit

    def _delete_corrupt(self, item: Pending, result: BatchResult | Said) -> Commit:
        """An operator deletes a record no reader can use: it goes, with every event of the
        batch for it (the others could only have failed it)."""
        commit = Commit(self.keys, item.workflow, self._shared)
        commit.delete()
        for event_id, kind, _ in item.events:
            if kind == ev.DELETE_WORKFLOW:
                commit.acks.append(event_id)
            else:
                result.rejected.append(
                    (event_id, f"event {event_id}: workflow {item.workflow}: {item.corrupt}")
                )
        return commit

    def _end(self, commit: Commit, now: int, status: str, state: State, item: Pending) -> None:
        """The workflow ends with ``commit``: counted, due for retention, its place under
        its concurrency key given to the next, and, unless it finished, a stop record its
        workers check: the attempts it stopped (their start-tasks still queued are
        skipped; a restart's next attempts are not)."""
        commit.end(now, status)
        concurrency = item.concurrency
        if concurrency is not None:
            key, most = concurrency["key"], concurrency["max"]
            commit.leave(key, most)
            if concurrency.get("queued"):  # ended before its turn (terminated, failed)
                item.concurrency = {"key": key, "max": most}
                commit.set(rec.CONCURRENCY, _dumps(item.concurrency))
        commit.reopened = False  # restarted, then ended again in this batch: scheduled anew
        if self.retain_ms:
            commit.expire_at = str(now + self.retain_ms)
        if status != rec.FINISHED:
            commit.stopped = _dumps(state.stopped)
            return
        if state.attempts:  # restarted (or cyclic) once: a stop record may be left
            commit.unstop = True
        keep = self.keep_details_ms
        if keep is not None and (not self.retain_ms or keep < self.retain_ms):
            # Retention's first step compacts its task records; it is removed when EXPIRES
            # says (0: never).
            commit.set(rec.EXPIRES, now + self.retain_ms if self.retain_ms else 0)
            commit.expire_at = str(now + keep)

    # -- one workflow ------------------------------------------------------------

    def plain_step(self, item: Pending, now: int) -> Commit | None:
        """The commit of the common batch item, computed without the general walk: one
        successful end-task, with its token, of the attempt running now in a whole state
        without joins or iterations, whose node only starts plain tasks with its output
        (``Machine.plain_next``) and neither it nor they have a timeout, the workflow
        neither paused nor waiting for its concurrency key (one admitted steps as any:
        only its start and its end concern the key). None for anything else, before
        anything is changed: :meth:`compute` (which tries this first) then takes the
        general path. A plain step says nothing of its event but its commit (no
        duplicate, no refusal). What it returns is what the general path would
        (tests/lifecycle/test_plain_step.py compares them)."""
        events = item.events
        if (
            len(events) != 1
            or item.held is not None  # (also while it waits for its concurrency key)
            or item.corrupt is not None
            or item.refused is not None
        ):
            return None
        event_id, kind, event = events[0]
        state = item.state
        if (
            kind != ev.END_TASK
            or type(event) is not ev.EndTask
            or not event.success
            or type(state) is not State
            or state.status != rec.RUNNING
            or state.fanin
            or state.waiting
            or type(now) is not int  # (the record's time is cut out below as %d writes it)
        ):
            return None
        key, attempt, running = event.key, event.attempt, state.running
        # A key running now is one of the graph's: the cache below grows with nodes only.
        if attempt is None or running.get(key) != attempt or "." in key:
            return None
        steps = self._steps.get((item.digest, item.priority))
        step = steps.get(key) if steps is not None else None
        if step is None:
            step = self._plain_facts(item, key)
            if step is None:
                return None
        starts = step.starts
        if step is _NOT_PLAIN or len(running) - 1 + len(starts) > _CHUNK_AT:
            return None  # (past _CHUNK_AT it would be stored chunked)
        output, worker = event.output, event.worker
        at = now if item.created is None else now - item.created  # (rec.record_offset, inline)
        try:
            # The successors' input: the output (None starts them with {}). Encoding it
            # doubles as the depth check, as on the general path.
            if output is None:
                input_json = b"{}"
                record = _dumps([at, True, None, None, worker])
            else:  # kept once, in the successors' start records (_end_record)
                input_json = _dumps(output)
                record = b"[%d,%b,%b]" % (at, _dumps(worker), starts[0][2])
        except orjson.JSONEncodeError:
            return None
        if (
            self._walk_depth
            and (type(output) is dict or type(output) is list)
            and not depth_within(output, self.limits.depth)
        ):
            return None
        workflow, salt = item.workflow, item.salt
        tokens = ev.task_tokens(salt or "", workflow, [(key, attempt), *step.attempts])
        if (
            salt is not None
            and tokens[0] != event.token
            and (event.token is not None or not self.untokened_answers)
        ):
            return None  # refused by the general path, with the reason
        del running[key]
        start_record = b"[1,%d,%b]" % (at, input_json)  # [1, at, input]
        workflow_json = _dumps(workflow)
        commit = Commit(self.keys, workflow, self._shared)
        fields = commit.fields
        fields += (step.end_field, record)
        sent = commit.events
        for (start, field, start_json, stream, template), token in zip(
            starts, tokens[1:], strict=True
        ):
            running[start] = 1
            fields += (field, start_record)
            values = (
                workflow_json,
                start_json,
                b"1",
                _dumps(ev.task_instance_id(workflow, start, 1)),
                _dumps(token),
                input_json,
            )
            sent.append((stream, values, template))
        if (
            state.attempts
            or state.output is not None
            or state.error is not None
            or state.started
            or state.stopped
        ):
            state_json = _dumps(state.to_dict())
        else:  # what to_dict() gives, without its walk
            state_json = _dumps({"status": rec.RUNNING, "running": running})
        version = int(item.version or 0) + 1
        fields += (rec.STATE, state_json, rec.VERSION, version)
        commit.acks.append(event_id)
        key_bytes = item.key or self.keys.workflow(workflow).encode()
        hset: tuple[bytes, ...] = (key_bytes, record, *repeat(start_record, len(starts)))
        commit.plain = (step.hset, (*hset, state_json, b"%d" % version))
        return commit

    def _plain_facts(self, item: Pending, key: str) -> _Step | None:
        """What the plain step of ``key``'s node needs, cached per graph and priority:
        its successors' start-tasks and the HSET of its fields, or :data:`_NOT_PLAIN`.
        None (not cached) when the graph cannot be had: the general path says why."""
        if item.digest is None:  # a record without its graph: refused by the general path
            return None
        try:
            machine = self.graphs.machine(item.digest)
            node = int(key)
            if not 0 <= node < len(machine.nodes) or str(node) != key:
                return None
            plain = machine.plain_next[node]
            facts = [self._task(item, machine, n) for n in (node, *(plain or ()))]
        except Exception:  # noqa: BLE001 - the general path says what is wrong, and fails it
            return None
        steps = self._steps.setdefault((item.digest, item.priority), {})
        if (
            plain is None
            or machine.limits.task_starts is not None
            or any(fact.policy.timeout for fact in facts)
        ):
            step = steps[key] = _NOT_PLAIN
            return step
        starts = tuple(
            (str(n), _START_PREFIX + str(n), _dumps(str(n)), fact.stream, fact.start_task)
            for n, fact in zip(plain, facts[1:], strict=True)
        )
        names = [_END_PREFIX + key, *(field for _, field, _, _, _ in starts)]
        step = steps[key] = _Step(
            _END_PREFIX + key,
            starts,
            tuple((start, 1) for start, _, _, _, _ in starts),
            _plain_hset([*names, rec.STATE, rec.VERSION]),
        )
        return step

    def _compute(self, item: Pending, result: BatchResult | Said, now: int) -> Commit | None:
        commit = Commit(self.keys, item.workflow, self._shared)
        state = item.state
        machine: Machine | None = None
        changed = False
        seen: set[Any] | None = set() if len(item.events) > 1 else None
        for event_id, kind, event in item.events:
            if commit.offer is not None:
                # An event of the workflow follows, in this batch, the one that queued
                # it: it must meet the workflow queued, as it does here. Replay applies
                # an admission in the commit right after the event that queued it, so
                # this one goes as an admit-workflow the gate appends after them.
                commit.offer, commit.offer_timers = None, []
            if seen is not None:
                # The same entry delivered twice: a redelivery. An end-tasks entry packs
                # several answers under one id: each is its own (a second answer to the
                # same attempt, or one with another token, is judged as any answer is).
                mark = (
                    (event_id, event.key, event.attempt, event.token, event.success)
                    if kind == ev.END_TASK
                    else event_id
                )
                if mark in seen:
                    result.duplicates.append(event_id)
                    continue
                seen.add(mark)
            try:
                if kind == ev.START_WORKFLOW:
                    if state is not None:
                        result.duplicates.append(event_id)
                        continue
                    # (after a delete earlier in this batch the id starts afresh: the
                    # commit deletes the old record before it writes this one)
                    machine = self.graphs.machine(event.graph)
                    state = State()
                    item.state, item.digest, item.salt = state, event.graph, event.salt
                    item.created = now
                    commit.created = str(now)
                    commit.set(rec.CREATED, now)
                    commit.set(rec.GRAPH, event.graph)
                    commit.set(rec.SALT, event.salt)
                    item.priority = event.priority
                    if event.priority:
                        commit.set(rec.PRIORITY, event.priority)
                    commit.set(rec.INPUT, encode_value(event.input, self.limits, "the input"))
                    if machine.graph.name:
                        commit.set(rec.NAME, machine.graph.name)
                    item.concurrency = None  # (a record deleted earlier in the batch)
                    if event.concurrency is not None:
                        key, most = event.concurrency
                        self._queue(item, commit, key, most, _order(event_id))
                    actions: list[Any] = machine.start(state, event.input)
                elif (
                    kind == ev.DELETE_WORKFLOW
                    and state is not None
                    and (item.digest is None or item.corrupt is not None)
                ):
                    # A record no machine can run (no graph): deleting it needs none.
                    applied = self._control(None, state, item, event_id, event, commit, now, result)
                    if applied is None:
                        continue
                    actions = applied
                else:
                    if state is None and kind == ev.ADMIT_WORKFLOW:
                        result.duplicates.append(event_id)  # deleted before its turn
                        continue
                    if item.compacted and item.digest is None and state is not None:
                        # Finished, compacted: its tokens' secret and attempts are gone, so
                        # an answer or a timer is the duplicate one for a finished workflow
                        # mostly is; a control is refused as for one.
                        if type(event) is ev.Control:
                            self._control(None, state, item, event_id, event, commit, now, result)
                        else:
                            result.duplicates.append(event_id)
                        continue
                    if state is None or item.digest is None:
                        result.rejected.append(
                            (event_id, f"event {event_id}: no workflow {item.workflow!r}")
                        )
                        continue
                    machine = machine or self.graphs.machine(item.digest)
                    applied = self._apply(
                        machine, state, item, event_id, kind, event, commit, now, result
                    )
                    if applied is None:
                        continue
                    actions = applied
                commit.acks.append(event_id)
                changed = True
                if item.state is None:  # deleted
                    state, machine = None, None
                    continue
                assert machine is not None
                self._carry_out(machine, state, item, actions, commit, now)
            except Missing:
                raise  # the caller loads what it names and computes the batch again
            except Exception as error:  # noqa: BLE001 - one workflow's data fails it alone
                raise _EventFailed(event_id, _reason(error)) from error
        if commit.deleted and state is None:
            return commit
        if not changed or state is None:
            return None
        if item.held is not None:
            commit.set(rec.PAUSED, _dumps(item.held))
        if commit.offer is not None:
            concurrency = item.concurrency
            if (
                commit.gate[-2:-1] == ["enter"]
                and concurrency is not None
                and concurrency.get("queued") is True
            ):
                commit.offer_admitted = _dumps(
                    {"key": concurrency["key"], "max": concurrency["max"]}
                )
            else:  # it left the line again in this batch (terminated, failed, finished)
                commit.offer = None
        if (
            type(state) is State
            and (len(state.running) > _CHUNK_AT or state.fanin or state.waiting)
            and machine is not None
            and machine.chunkable
            and _large(state)
        ):
            # From now on stored entry by entry: each event costs the same, however large.
            state = ChunkedState.of(state) or state
            item.state = state
        if type(state) is ChunkedState:
            write_changes(state, commit.fields, commit.removed)
        if commit.removed:  # a field removed then set again in this batch (resume, pause) stays
            written = set(commit.fields[::2])
            commit.removed = [name for name in commit.removed if name not in written]
        commit.fields += (
            rec.STATE,
            _dumps(state.to_dict()),
            rec.VERSION,
            int(item.version or 0) + 1,
        )
        return commit

    def _apply(
        self,
        machine: Machine,
        state: State,
        item: Pending,
        event_id: str,
        kind: str,
        event: Any,
        commit: Commit,
        now: int,
        result: BatchResult | Said,
    ) -> list[Any] | None:
        """One event against the state; None when it changes nothing (the event went to
        ``result``'s duplicates or rejected)."""
        if type(event) is ev.Control:
            return self._control(machine, state, item, event_id, event, commit, now, result)
        key = event.key
        running = state.running.get(key)
        attempt = event.attempt if event.attempt is not None else running
        end_task = kind == ev.END_TASK
        if state.status != rec.RUNNING or attempt is None or running != attempt:
            if not end_task or (
                (state.status != rec.RUNNING or event.packed)
                and attempt is not None
                and self._answers(item, event, attempt)
            ):
                # A timer that fired after its attempt ended (the engine's own race), a
                # genuine answer from a task still running when its workflow ended, or
                # one of a pack delivered again after some of its answers committed.
                result.duplicates.append(event_id)
            else:  # a second answer, or one for an attempt long gone
                result.rejected.append((event_id, _stale(event_id, item, state, key, attempt)))
            return None
        if end_task and not self._answers(item, event, attempt):
            what = "carries no token" if event.token is None else "has a wrong token"
            result.rejected.append(
                (
                    event_id,
                    f"event {event_id}: end-task of {item.workflow} task {key} attempt "
                    f"{attempt} {what}: it does not answer that attempt's start-task",
                )
            )
            return None
        # the node's retry/timeout policy (inline: once per event)
        policy = self._task(item, machine, int(key.partition(".")[0])).policy
        if kind == ev.RETRY_TASK:
            return [machine.task_action(key, attempt, item.inputs.get(key))]
        if policy.timeout:
            commit.cancels.append(ev.timer_member(ev.TIMEOUT_TASK, item.workflow, key, attempt))
        if end_task and event.success:
            output = event.output
            try:
                # The output's encoding doubles as the depth check: orjson refuses values
                # nested deeper than it can write (about the default limit), so the walk
                # runs only where a lower limit is configured.
                output_json = _dumps(output)
            except orjson.JSONEncodeError as error:
                raise LifecycleError(f"task {key}: output cannot be stored: {error}") from None
            if (
                self._walk_depth
                and (type(output) is dict or type(output) is list)
                and not depth_within(output, self.limits.depth)
            ):
                raise LifecycleError(
                    f"task {key}: output nests deeper than {self.limits.depth} levels"
                )
            actions = machine.task_ended(state, key, attempt, output)
            at = rec.record_offset(now, item.created)
            record = _end_record(machine, key, at, output, output_json, event.worker, actions)
            commit.fields += (_END_PREFIX + key, record)
            return actions
        if end_task:
            reason, worker = event.error or "failed", event.worker
        else:
            reason, worker = f"timed out after {policy.timeout}s", None
        at = rec.record_offset(now, item.created)
        commit.set(rec.end_field(key), _dumps([at, False, None, reason, worker]))
        tries = machine.invocation_attempt(state, key, attempt)  # not attempt: cycles
        retry = tries <= policy.retries
        actions = machine.task_failed(state, key, attempt, reason, retry, item.inputs.get(key))
        delay = policy.retry_delay(tries) if retry else 0
        if retry and delay > 0:
            member = ev.timer_member(ev.RETRY_TASK, item.workflow, key, attempt + 1)
            commit.timers += (now + int(delay * 1000), member)
            return []
        return actions

    def _control(
        self,
        machine: Machine | None,
        state: State,
        item: Pending,
        event_id: str,
        event: ev.Control,
        commit: Commit,
        now: int,
        result: BatchResult | Said,
    ) -> list[Any] | None:
        """An operator's control event; None when it changes nothing: a repeat (pausing a
        paused workflow) is a duplicate, one its state does not allow is rejected."""
        kind, status, paused = event.kind, state.status, item.held is not None
        queued = item.concurrency is not None and item.concurrency.get("queued") is True
        if kind == ev.ADMIT_WORKFLOW:
            if not queued or status != rec.RUNNING:  # ended before its turn came
                result.duplicates.append(event_id)
                return None
            assert machine is not None
            return self._admit(machine, state, item, commit)
        shown = rec.shown_state(status, paused, queued)
        refusal = ev.refusal(kind, shown, bool(state.stopped))
        if refusal is not None:
            if refusal == ev.ALREADY:
                result.duplicates.append(event_id)
            else:
                result.rejected.append(
                    (event_id, f"event {event_id}: {kind} of {item.workflow}: {refusal}")
                )
            return None
        if kind == ev.TERMINATE_WORKFLOW:
            assert machine is not None
            machine.terminate(state, event.reason)
            if paused:  # (or queued) what was held is part of what a restart starts again
                commit.removed.append(rec.PAUSED)
                item.held = None
            self._end(commit, now, rec.TERMINATED, state, item)
            commit.append(
                self.keys.lifecycle,
                ev.failed_workflow(item.workflow, state.error or event.reason, rec.TERMINATED),
            )
            return []
        if kind == ev.PAUSE_WORKFLOW:
            item.held = []
            return []
        if kind == ev.RESUME_WORKFLOW:
            assert machine is not None
            return _release_held(machine, state, item, commit)
        if kind == ev.RESTART_WORKFLOW:
            assert machine is not None
            concurrency = item.concurrency
            if concurrency is not None:  # in line again, behind those waiting now
                self._queue(item, commit, concurrency["key"], concurrency["max"], now * 1000)
            actions: list[Any] = machine.restart(state, item.inputs)
            commit.removed.append(rec.ENDED)
            commit.reopened = True  # its stop record stays: the stopped attempts stay stopped
            return actions
        commit.delete()  # DELETE_WORKFLOW: what this batch wrote before goes too
        item.state, item.digest, item.held = None, None, None
        return []

    def _queue(self, item: Pending, commit: Commit, key: str, most: int, order: int) -> None:
        """The workflow waits for its concurrency key: its start-tasks are held (as while
        paused) until the gate admits it; the gate runs in this commit's transaction."""
        item.concurrency = {"key": key, "max": most, "queued": True}
        commit.set(rec.CONCURRENCY, _dumps(item.concurrency))
        item.held = []
        commit.enter(key, most, order)
        # What the gate sends should it admit the workflow in this commit's transaction:
        # the start-tasks held from here on, built as they are held (_carry_out).
        commit.offer, commit.offer_timers = [], []

    def _admit(self, machine: Machine, state: State, item: Pending, commit: Commit) -> list[Any]:
        """Its turn under its concurrency key came: the held start-tasks go, in order."""
        assert item.concurrency is not None
        item.concurrency = {"key": item.concurrency["key"], "max": item.concurrency["max"]}
        commit.set(rec.CONCURRENCY, _dumps(item.concurrency))
        return _release_held(machine, state, item, commit)

    def _carry_out(
        self,
        machine: Machine,
        state: State,
        item: Pending,
        actions: list[Any],
        commit: Commit,
        now: int,
    ) -> None:
        workflow = item.workflow
        workflow_json = None
        salt = item.salt or ""
        start_prefix = rec.START_PREFIX
        held = item.held
        offer = commit.offer
        at = rec.record_offset(now, item.created)
        for action in actions:
            if isinstance(action, StartTask):
                task = self._task(item, machine, action.node)
                key, attempt = action.key, action.attempt
                input_json = _dumps(action.input)
                # n:<key> = [attempt, started, input], spliced: the input is encoded once
                record = b"[%d,%d,%b]" % (attempt, at, input_json)
                queued = held is not None
                if held is not None:  # paused or queued: recorded, sent by resume or admission
                    commit.set(start_prefix + key, record)
                    held.append(key)
                    item.note_input(key, action.input)
                    if offer is None:
                        continue
                    # Queued by this commit: sent by its gate if it admits the workflow at
                    # once, exactly as an admission applied now would send it.
                    sent = offer
                else:
                    if item.resends:
                        item.note_input(key, action.input)
                    commit.fields += (start_prefix + key, record)
                    sent = commit.events
                workflow_json = workflow_json or _dumps(workflow)
                # (Commit.append_filled, inline: once per task)
                sent.append(
                    (
                        task.stream,
                        _start_values(
                            workflow,
                            workflow_json,
                            ev.task_token(salt, workflow, key, attempt),
                            key,
                            attempt,
                            input_json,
                        ),
                        task.start_task,
                    )
                )
                if task.policy.timeout:
                    member = ev.timer_member(ev.TIMEOUT_TASK, workflow, key, attempt)
                    due = (now + int(task.policy.timeout * 1000), member)
                    if queued:
                        commit.offer_timers += due
                    else:
                        commit.timers += due
            elif isinstance(action, Finished):
                if item.held is not None:  # paused with nothing left to hold: it is done
                    commit.removed.append(rec.PAUSED)
                    item.held = None
                self._end(commit, now, rec.FINISHED, state, item)
                commit.append(self.keys.lifecycle, ev.end_workflow(workflow, action.output))
            elif isinstance(action, Failed):
                if item.held is not None:  # nothing held starts any more
                    commit.removed.append(rec.PAUSED)
                    item.held = None
                self._end(commit, now, rec.FAILED, state, item)
                commit.append(self.keys.lifecycle, ev.failed_workflow(workflow, action.reason))

    def _task(self, item: Pending, machine: Machine, node: int) -> _TaskFacts:
        """What every start-task of ``node`` shares, cached per graph and priority: its
        stream, its encoded name/index/parameters, and its retry/timeout policy."""
        cached = (item.digest or "", item.priority)
        facts = self._tasks.get(cached)
        if facts is None:
            facts = self._tasks[cached] = [None] * len(machine.nodes)
        found = facts[node]
        if found is None:
            spec = machine.nodes[node]
            name = spec.name or ""
            try:
                params, policy = split_params(spec.params)
            except (LifecycleError, FlowError) as error:
                # `lifecycle run` refuses such flows; one stored by other means still runs.
                log.warning("workflow %s node %s: %s; no retry policy", item.workflow, node, error)
                params, policy = spec.params, Policy()
            node_kind = str(spec.kind)
            stream = self.keys.tasks(task_kind(name, node_kind), item.priority)
            parameters = params if params is not None else {}
            role = node_kind if node_kind in ev.ROLES else None
            # A task with a deadline goes alone: in a pack, its answer would wait for the
            # tasks before it in the pack, and its timer runs meanwhile.
            template = ev.start_task_template(
                stream,
                name,
                node,
                parameters,
                role,
                item.priority,
                packable=policy.timeout is None,
            )
            found = facts[node] = _TaskFacts(stream, template, policy)
        return found

    def _answers(self, item: Pending, event: Any, attempt: int) -> bool:
        """Whether an end-task carries the token of ``attempt``'s start-task (workflows
        started before tokens existed have no salt: every answer is taken)."""
        salt = item.salt
        if salt is None or (event.token is None and self.untokened_answers):
            return True
        # Derived again rather than remembered from the start: under load the end-task
        # often reaches another lifecycle worker, and a cache of tokens in flight cost
        # more (misses, and the collector walking it) than the hash it saves.
        return bool(event.token == ev.task_token(salt, item.workflow, event.key, attempt))


def _start_values(
    workflow: str, workflow_json: bytes, token: str, key: str, attempt: int, input_json: bytes
) -> tuple[bytes, ...]:
    """The slot values of a start-task's template (lifecycle.events.start_task_template)."""
    return (
        workflow_json,
        _dumps(key),
        b"%d" % attempt,
        _dumps(ev.task_instance_id(workflow, key, attempt)),
        _dumps(token),
        input_json,
    )


def _plain_hset(names: list[str]) -> Template:
    """``HSET <key> <name> <value> ...`` of a plain step's fields, packed but for the key
    and the values."""
    arguments: list[Any] = ["HSET", SLOT]
    for name in names:
        arguments += (name, SLOT)
    return Template(*arguments)


def _release_held(machine: Machine, state: State, item: Pending, commit: Commit) -> list[Any]:
    """The start-tasks held (paused, or queued under a concurrency key) go, in order:
    those still running, with the inputs recorded when they were held."""
    held, item.held = item.held or [], None
    commit.removed.append(rec.PAUSED)
    running = state.running
    return [
        machine.task_action(key, running[key], item.inputs.get(key))
        for key in held
        if key in running
    ]


def _order(event_id: str) -> int:
    """A start-workflow's place in its concurrency key's line: its stream entry id as
    ``ms * 1000 + seq`` (seq capped: entries of one ms past the thousandth share one)."""
    ms, _, seq = event_id.partition("-")
    try:
        return int(ms) * 1000 + min(int(seq or 0), 999)
    except ValueError:
        return 0


_END_PREFIX = rec.END_PREFIX
_START_PREFIX = rec.START_PREFIX
_CHUNK_AT = 64  # entries of one table (or one iteration's items) past which it is chunked


def _end_record(
    machine: Machine,
    key: str,
    at: int,
    output: Any,
    output_json: bytes,
    worker: Any,
    actions: list[Any],
) -> bytes:
    """The end record of a task instance that ended well (``output_json``: its output,
    encoded): the output named by reference to the successor it started with that very
    output, where the graph makes that successor start once a run (a plain successor:
    one predecessor, on no cycle and after none; ``rec.END_PREFIX``); the output itself
    otherwise. The plain step writes the same, inline."""
    if (
        output is not None
        and machine.plain_next[int(key.partition(".")[0])] is not None
        and machine.limits.task_starts is None
        and actions
        and type(actions[0]) is StartTask
        and actions[0].input is output
    ):
        return _dumps([at, worker, actions[0].key])
    if type(at) is not int:  # (not the engine's clock: written as it is)
        return _dumps([at, True, output, None, worker])
    return b"[%d,true,%b,null,%b]" % (at, output_json, _dumps(worker))  # [at, True, output, ...]


def _large(state: State) -> bool:
    """Whether ``state`` holds a table large enough to store entry by entry."""
    if len(state.running) > _CHUNK_AT:
        return True
    if state.fanin and any(len(entry[1]) > _CHUNK_AT for entry in state.fanin.values()):
        return True
    return bool(state.waiting) and any(len(w) > _CHUNK_AT for w in state.waiting.values())


def _stale(event_id: str, item: Pending, state: State, key: str, attempt: int | None) -> str:
    where = f"event {event_id}: end-task of {item.workflow} task {key}"
    if state.status != rec.RUNNING:
        return f"{where}: the workflow is {state.status}"
    running = state.running.get(key)
    if running is None:
        return f"{where} attempt {attempt}: the task is not running (a second answer?)"
    return f"{where} attempt {attempt}: attempt {running} runs now (a stale answer)"
