"""Advance workflows from a batch of lifecycle events: compute with the Machine, commit atomically.

For each workflow in the batch: load its version and state (one pipelined
round trip for the whole batch, under WATCH), apply its events in order with
:class:`flowlang.machine.Machine`, then commit — new state, task instance
records, start-task events, timers and the acknowledgement of the events —
as one MULTI/EXEC for the whole batch, or, after another worker advanced one
of its workflows in between (EXEC refused, nothing written), workflow by
workflow with ``advance.lua``, which first checks the version. A workflow
that loses a race is recomputed from fresh state. Duplicate and
stale events change nothing (the machine ignores an end for an attempt that
is not running), so redelivery after a crash is harmless.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import redis

from flowlang.machine import (
    FAILED,
    FINISHED,
    TERMINATED,
    Failed,
    Finished,
    Machine,
    StartTask,
    State,
)
from lifecycle import events as ev
from lifecycle.commit import BatchResult, Commit, Pending, Said, shared_keys, timer_member
from lifecycle.errors import BadEvent, FlowNotStored, LifecycleError
from lifecycle.keys import Keys, task_kind
from lifecycle.policy import Policy, split_params
from lifecycle.store import GraphCache
from rqse import fastpipe, lua

__all__ = ["Advancer", "BatchResult", "Commit", "Pending"]

log = logging.getLogger(__name__)

_SCRIPTS = lua.scripts_dir(__file__)
_START_TASK_JSON = orjson.dumps(ev.START_TASK)
_MAX_CONFLICTS = 50
_LOAD = fastpipe.Template("HMGET", fastpipe.SLOT, "v", "s", "g")  # version, state, graph
_dumps = orjson.dumps


@dataclass(frozen=True, slots=True)
class _TaskFacts:
    stream: str
    start_task: fastpipe.Template  # XADD of its start-task; slots: see _carry_out
    policy: Policy


def _start_task_template(stream: str, name: str, node: int, parameters: Any) -> fastpipe.Template:
    """What every start-task of one node shares, packed once (docs/events.md)."""
    slot = fastpipe.SLOT
    return fastpipe.Template(
        "XADD", stream, "*",
        b"kind", _START_TASK_JSON,
        b"workflow", slot,
        b"name", _dumps(name),
        b"index", _dumps(node),
        b"key", slot,
        b"attempt", slot,
        b"id", slot,
        b"input", slot,
        b"parameters", _dumps(parameters),
    )  # fmt: skip


def _ms() -> int:
    return int(time.time() * 1000)


class GraphSource(Protocol):  # GraphCache live; the archive's graphs in replay
    def machine(self, digest: str) -> Machine: ...


def _is_noscript(reply: Any) -> bool:
    return isinstance(reply, redis.exceptions.NoScriptError)


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


class Advancer:
    """Turns lifecycle events into committed workflow transitions."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys | None = None,
        clock: Callable[[], int] = _ms,
    ) -> None:
        self.client = client
        self.keys = keys or Keys()
        self.clock = clock
        self.graphs: GraphSource = GraphCache(client, self.keys)
        self.script = lua.load_script(client, "advance", _SCRIPTS)
        self._tasks: dict[str, list[_TaskFacts | None]] = {}  # graph hash -> per node
        self._shared = shared_keys(self.keys)

    @classmethod
    def offline(
        cls, graphs: GraphSource, keys: Keys | None = None, clock: Callable[[], int] = _ms
    ) -> Advancer:
        """No Redis: for replay, which runs live execution's own :meth:`compute`."""
        advancer = cls.__new__(cls)
        advancer.keys = keys or Keys()
        advancer.clock = clock
        advancer.graphs = graphs
        advancer._tasks = {}
        advancer._shared = shared_keys(advancer.keys)
        return advancer

    def compute(self, item: Pending, result: BatchResult | Said) -> Commit | None:
        """The pure step: apply ``item.events`` to ``item.state`` and return what to commit
        (None when nothing changes). No Redis call once the graph is cached."""
        return self._compute(item, result, self.clock())

    # -- public ------------------------------------------------------------------

    def apply(self, entries: list[tuple[str, dict[str, Any]]]) -> BatchResult:
        """Apply lifecycle events (entry id, decoded event). The caller acknowledges
        ``duplicates`` and dead-letters ``rejected``; the ids in ``acknowledged`` (committed
        events, and duplicates acknowledged with them) are acknowledged here."""
        result = BatchResult()
        pending = self._group(entries, result)
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
                now = self.clock()  # one reading per round: its records share a time
                for item in pending:
                    # A workflow that loses the race is recomputed from fresh state: what
                    # this round said of its events counts only if the round's commit wins.
                    said = Said()
                    commit = self._compute(item, said, now)
                    if commit is None:
                        said.into(result)
                    else:
                        commits.append((item, commit, said))
                if watched:
                    # Events that change nothing are acknowledged in the same transaction
                    # (not in a round trip of their own) when it wins.
                    extra = result.duplicates + [
                        d for _, _, said in commits for d in said.duplicates
                    ]
                    outcome = self._commit_watched(
                        [commit for _, commit, _ in commits], extra, send
                    )
                    if extra and (outcome[0] if outcome else True):
                        result.acknowledged += extra
            if not watched:
                outcome = self._commit([(item, commit) for item, commit, _ in commits])
            pending = []
            for (item, commit, said), won in zip(commits, outcome, strict=True):
                if won:
                    said.into(result)
                    result.acknowledged += commit.acks
                    result.committed += 1
                else:
                    pending.append(item)
                    result.conflicts += 1
            rounds += 1
            if rounds > _MAX_CONFLICTS and pending:
                raise LifecycleError(
                    f"workflow {pending[0].workflow}: gave up after {rounds} conflicts"
                )
        return result

    # -- steps -------------------------------------------------------------------

    def _group(
        self, entries: list[tuple[str, dict[str, Any]]], result: BatchResult
    ) -> list[Pending]:
        by_workflow: dict[str, Pending] = {}
        parse_end_task, end_task_kind = ev.parse_end_task, ev.END_TASK
        for event_id, event in entries:
            kind = event.get("kind")
            try:
                if kind == end_task_kind:
                    parsed = parse_end_task(event_id, event)
                else:
                    parsed = self._parse(event_id, kind, event)
            except BadEvent as error:
                result.rejected.append((event_id, str(error)))
                continue
            if parsed is None:
                result.duplicates.append(event_id)  # not a lifecycle input: nothing to do
                continue
            workflow = parsed.workflow if not isinstance(parsed, tuple) else parsed[0]
            item = by_workflow.get(workflow)
            if item is None:
                item = by_workflow[workflow] = Pending(workflow, [])
            item.events.append((event_id, kind, parsed))
        return list(by_workflow.values())

    @staticmethod
    def _parse(event_id: str, kind: Any, event: dict[str, Any]) -> Any:
        if kind == ev.END_TASK:
            return ev.parse_end_task(event_id, event)
        if kind == ev.START_WORKFLOW:
            return ev.parse_start_workflow(event_id, event)
        if kind in (ev.RETRY_TASK, ev.TIMEOUT_TASK):
            return ev.parse_task_timer(event_id, event)
        if kind == ev.TERMINATE_WORKFLOW:
            return ev.parse_terminate(event_id, event)
        return None

    def _load(self, pending: list[Pending], send: fastpipe.Send, watch: bool) -> None:
        workflow_key = self.keys.workflow
        needing = [_keys_needing_input(item) for item in pending]
        names = [workflow_key(item.workflow) for item in pending]
        commands: list[Any] = [("WATCH", *names)] if watch else []
        load = _LOAD.fill
        for key, inputs in zip(names, needing, strict=True):
            if inputs:  # a retry may need the inputs of failed attempts
                commands.append(("HMGET", key, "v", "s", "g", *[f"n:{k}" for k in inputs]))
            else:
                commands.append(load(key.encode()))
        replies = _raise_errors(send(commands))[1 if watch else 0 :]
        loads, from_dict = orjson.loads, State.from_dict
        for item, keys, values in zip(pending, needing, replies, strict=True):
            version, state, digest = values[0], values[1], values[2]
            item.version = version.decode() if version else ""
            item.state = from_dict(loads(state)) if state else None
            item.digest = digest.decode() if digest else None
            if keys:
                item.inputs = {
                    key: loads(raw)[2]
                    for key, raw in zip(keys, values[3:], strict=True)
                    if raw is not None
                }

    def _commit_watched(
        self, commits: list[Commit], extra_acks: list[str], send: fastpipe.Send
    ) -> list[bool]:
        """All ``commits`` in one MULTI/EXEC on the connection that sent the WATCH, with the
        acknowledgement of their events and of ``extra_acks``: all written (True each) or,
        when a watched workflow changed, none (False each)."""
        xack = ("XACK", self._shared[0], self.keys.lifecycle_group)
        if not commits:
            _raise_errors(
                send([("UNWATCH",), (*xack, *extra_acks)] if extra_acks else [("UNWATCH",)])
            )
            return []
        commands: list[tuple[Any, ...]] = []
        for commit in commits:
            commands += commit.commands()
        acks = [event_id for commit in commits for event_id in commit.acks]
        commands.append((*xack, *acks, *extra_acks))
        won = fastpipe.transaction(send, commands) is not None
        return [won] * len(commits)

    def _commit(self, commits: list[tuple[Pending, Commit]]) -> list[bool]:
        if not commits:
            return []
        group = self.keys.lifecycle_group
        commands = []
        for item, commit in commits:
            keys, args = commit.script_call(group, item.version)
            commands.append(("EVALSHA", self.script.sha, len(keys), *keys, *args))
        replies = fastpipe.execute(self.client, commands)
        if any(_is_noscript(reply) for reply in replies):  # after a restart or SCRIPT FLUSH
            self.client.script_load(lua.script_source("advance", _SCRIPTS))
            replies = fastpipe.execute(self.client, commands)
        return [bool(won) for won in _raise_errors(replies)]

    # -- one workflow ------------------------------------------------------------

    def _compute(self, item: Pending, result: BatchResult | Said, now: int) -> Commit | None:
        commit = Commit(self.keys, item.workflow, self._shared)
        state = item.state
        machine: Machine | None = None
        changed = False
        for event_id, kind, event in item.events:
            if kind == ev.START_WORKFLOW:
                if state is not None:
                    result.duplicates.append(event_id)
                    continue
                try:
                    machine = self.graphs.machine(event.graph)
                except FlowNotStored as error:
                    result.rejected.append((event_id, f"event {event_id}: {error}"))
                    continue
                state = State()
                item.digest = event.graph
                commit.created = str(now)
                commit.set("g", event.graph)
                commit.set("created", now)
                if machine.graph.name:
                    commit.set("name", machine.graph.name)
                commit.set("input", _dumps(event.input))
                actions = machine.start(state, event.input)
            elif state is None and kind == ev.TERMINATE_WORKFLOW:
                # Terminated before its start-workflow was applied (that event may be in
                # another worker's hands): record it terminated, so the start changes nothing.
                state = State(status="terminated", error=event[1])
                commit.created = str(now)
                commit.set("created", now)
                commit.end(now, TERMINATED)
                commit.append(
                    self.keys.lifecycle,
                    {
                        "kind": ev.FAILED_WORKFLOW,
                        "workflow": item.workflow,
                        "reason": event[1],
                        "status": "terminated",
                    },
                )
                commit.acks.append(event_id)
                changed = True
                continue
            else:
                if state is None or item.digest is None:
                    result.rejected.append(
                        (event_id, f"event {event_id}: no workflow {item.workflow!r}")
                    )
                    continue
                machine = machine or self.graphs.machine(item.digest)
                actions = self._apply(machine, state, item, kind, event, commit, now)
                if actions is None:
                    result.duplicates.append(event_id)
                    continue
            commit.acks.append(event_id)
            changed = True
            self._carry_out(machine, state, item, actions, commit, now)
        if not changed or state is None:
            return None
        commit.set("s", _dumps(state.to_dict()))
        commit.set("v", int(item.version or 0) + 1)
        return commit

    def _apply(
        self,
        machine: Machine,
        state: State,
        item: Pending,
        kind: str,
        event: Any,
        commit: Commit,
        now: int,
    ) -> list[Any] | None:
        """One event against the state; None when it changes nothing."""
        if kind == ev.TERMINATE_WORKFLOW:
            if state.status != "running":
                return None
            machine.terminate(state, event[1])
            commit.end(now, TERMINATED)
            commit.append(
                self.keys.lifecycle,
                {
                    "kind": ev.FAILED_WORKFLOW,
                    "workflow": item.workflow,
                    "reason": state.error,
                    "status": "terminated",
                },
            )
            return []
        key = event.key
        attempt = event.attempt if event.attempt is not None else state.running.get(key)
        if state.status != "running" or attempt is None or state.running.get(key) != attempt:
            return None  # stale: another attempt runs, or the workflow has ended
        policy = self._policy(item, machine, key)
        if kind == ev.RETRY_TASK:
            return [machine.task_action(key, attempt, item.inputs.get(key))]
        if policy.timeout:
            commit.cancels.append(timer_member(ev.TIMEOUT_TASK, item.workflow, key, attempt))
        if kind == ev.END_TASK and event.success:
            commit.set(f"o:{key}", _dumps([now, True, event.output, None, event.worker]))
            return machine.task_ended(state, key, attempt, event.output)
        if kind == ev.END_TASK:
            reason, worker = event.error or "failed", event.worker
        else:
            reason, worker = f"timed out after {policy.timeout}s", None
        commit.set(f"o:{key}", _dumps([now, False, None, reason, worker]))
        tries = machine.invocation_attempt(state, key, attempt)  # not attempt: cycles
        retry = tries <= policy.retries
        actions = machine.task_failed(state, key, attempt, reason, retry, item.inputs.get(key))
        delay = policy.retry_delay(tries) if retry else 0
        if retry and delay > 0:
            member = timer_member(ev.RETRY_TASK, item.workflow, key, attempt + 1)
            commit.timers += (now + int(delay * 1000), member)
            return []
        return actions

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
        for action in actions:
            if isinstance(action, StartTask):
                task = self._task(item, machine, action.node)
                key, attempt = action.key, action.attempt
                workflow_json = workflow_json or _dumps(workflow)
                input_json = _dumps(action.input)
                # n:<key> = [attempt, started ms, input], spliced: the input is encoded once
                commit.set(f"n:{key}", b"[%d,%d,%b]" % (attempt, now, input_json))
                commit.append_filled(
                    task.stream,
                    task.start_task,
                    (
                        workflow_json,
                        _dumps(key),
                        b"%d" % attempt,
                        _dumps(ev.task_instance_id(workflow, key, attempt)),
                        input_json,
                    ),
                )
                if task.policy.timeout:
                    member = timer_member(ev.TIMEOUT_TASK, workflow, key, attempt)
                    commit.timers += (now + int(task.policy.timeout * 1000), member)
            elif isinstance(action, Finished):
                commit.end(now, FINISHED)
                commit.append(
                    self.keys.lifecycle,
                    {"kind": ev.END_WORKFLOW, "workflow": workflow, "output": action.output},
                )
            elif isinstance(action, Failed):
                commit.end(now, FAILED)
                commit.append(
                    self.keys.lifecycle,
                    {"kind": ev.FAILED_WORKFLOW, "workflow": workflow, "reason": action.reason},
                )

    def _task(self, item: Pending, machine: Machine, node: int) -> _TaskFacts:
        """What every start-task of ``node`` shares, cached per graph: its stream, its
        encoded name/index/parameters, and its retry/timeout policy."""
        facts = self._tasks.get(item.digest or "")
        if facts is None:
            facts = self._tasks[item.digest or ""] = [None] * len(machine.nodes)
        found = facts[node]
        if found is None:
            spec = machine.nodes[node]
            name = spec.name or ""
            try:
                params, policy = split_params(spec.params)
            except LifecycleError as error:
                # `lifecycle run` refuses such flows; one stored by other means still runs.
                log.warning("workflow %s node %s: %s; no retry policy", item.workflow, node, error)
                params, policy = spec.params, Policy()
            stream = self.keys.tasks(task_kind(name, str(spec.kind)))
            parameters = params if params is not None else {}
            found = facts[node] = _TaskFacts(
                stream, _start_task_template(stream, name, node, parameters), policy
            )
        return found

    def _policy(self, item: Pending, machine: Machine, key: str) -> Policy:
        """The retry/timeout policy of the node of instance ``key``."""
        node = int(key) if "." not in key else int(key.split(".", 1)[0])
        return self._task(item, machine, node).policy
