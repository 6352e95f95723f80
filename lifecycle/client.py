"""The operator's client: the one object the CLI (and later the HTTP API) acts through.

Every action on a workflow is an event on the lifecycle stream, applied by a
lifecycle worker like any other and archived with the rest, so a replay
rebuilds it. The client checks first what it can — the workflow exists, its
state allows the action (:func:`lifecycle.events.refusal`, the rule the
lifecycle applies too) — so a typo'd id creates nothing and a refused action
says why at once; then it sends the event and, for one workflow, can wait
until a lifecycle worker has applied it::

    client = Client(redis.Redis())
    client.terminate("orders-1f2e...", reason="duplicate order", wait=5)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from flowlang.graph import Graph
from flowlang.limits import DEFAULT_LIMITS, Limits
from lifecycle import compact
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.errors import LifecycleError, NotAllowed
from lifecycle.inspect import no_workflow
from lifecycle.keys import Keys
from lifecycle.submit import start_workflow, start_workflow_once

__all__ = ["ACTS_ON", "Applied", "Client", "Selection", "WorkflowStatus"]

_PAGE = 500  # workflows read per round trip when selecting by filter


@dataclass(frozen=True, slots=True)
class WorkflowStatus:
    """What the client reads of a workflow to decide on an action."""

    id: str
    state: str  # one of records.SHOWN_STATES
    version: int
    ended: str | None  # ms, when it ended
    restartable: bool  # a restart has task instances to start again
    flow: str | None
    error: str | None = None  # why it failed or was terminated


# The states each control applies to (besides the one it leads to, which is "already so").
ACTS_ON: dict[str, tuple[str, ...]] = {
    ev.TERMINATE_WORKFLOW: (rec.RUNNING, rec.PAUSED_STATE, rec.QUEUED_STATE),
    ev.PAUSE_WORKFLOW: (rec.RUNNING,),
    ev.RESUME_WORKFLOW: (rec.PAUSED_STATE,),
    ev.RESTART_WORKFLOW: (rec.FAILED, rec.TERMINATED),
    ev.DELETE_WORKFLOW: rec.ENDED_STATES,
}


@dataclass(frozen=True, slots=True)
class Applied:
    """The outcome of one action on one workflow.

    ``event_id`` is the event sent, None when nothing was: the workflow already was so
    (``state``), or its state does not allow the action (``refused`` says why).
    ``state`` is the state seen once a lifecycle worker applied it; None when the caller
    did not wait or it was not applied in time; ``deleted`` after a delete.
    ``overtaken``: the workflow ended on its own (``state``) before the action reached
    it, so the lifecycle refused the action. ``before`` is the state it was sent in,
    ``error`` the workflow's error when ``state`` is failed or terminated.
    """

    workflow: str
    event_id: str | None  # None: nothing sent
    state: str | None
    refused: str | None = None
    before: str | None = None
    error: str | None = None
    overtaken: bool = False


@dataclass(frozen=True, slots=True)
class Selection:
    """Which workflows a bulk action applies to: every given filter must match.
    ``state`` is one state or several (any of them matches); ``created_before``: only
    workflows created before this time (ms); ``schedule``: only the runs of that
    schedule (started before ``created_before`` by their fire time)."""

    state: str | tuple[str, ...] | None = None
    flow: str | None = None
    created_before: int | None = None
    schedule: str | None = None

    def __post_init__(self) -> None:
        if self.state is not None and not isinstance(self.state, str):
            object.__setattr__(self, "state", tuple(self.state))
        for state in self.states:
            if state not in rec.SHOWN_STATES:
                raise LifecycleError(
                    f"unknown state {state!r}: one of {', '.join(rec.SHOWN_STATES)}"
                )

    @property
    def states(self) -> tuple[str, ...]:
        """The states selected; empty when any state matches."""
        if self.state is None:
            return ()
        return (self.state,) if isinstance(self.state, str) else self.state

    def matches(self, status: WorkflowStatus) -> bool:
        states = self.states
        return (not states or status.state in states) and (
            self.flow is None or status.flow == self.flow
        )


class Client:
    """Start, look at and control workflows in one deployment (``keys``)."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None) -> None:
        self.redis = client
        self.keys = keys or Keys()

    # -- starting ----------------------------------------------------------------

    def submit(
        self,
        graph: Graph,
        input: Any = None,
        workflow_id: str | None = None,
        limits: Limits = DEFAULT_LIMITS,
        *,
        priority: int = 0,
        concurrency_key: str | None = None,
        max_running: int | None = None,
    ) -> str:
        """Store ``graph`` and send its start-workflow; return the workflow id.
        ``priority``: see lifecycle.priorities (:class:`BadPriority` out of range). With a
        ``concurrency_key``, at most ``max_running`` workflows of that key run at once;
        the others wait ``queued``, started in the order they were sent."""
        return start_workflow(
            self.redis,
            graph,
            input,
            workflow_id,
            self.keys,
            limits,
            priority=priority,
            concurrency_key=concurrency_key,
            max_running=max_running,
        )

    def submit_once(
        self,
        graph: Graph,
        input: Any,
        workflow_id: str,
        limits: Limits = DEFAULT_LIMITS,
        *,
        priority: int = 0,
        concurrency_key: str | None = None,
        max_running: int | None = None,
    ) -> bool:
        """Start ``graph`` as ``workflow_id`` unless a workflow has that id (checked and
        started in one step); False when it is taken and nothing was sent."""
        return start_workflow_once(
            self.redis,
            graph,
            input,
            workflow_id,
            self.keys,
            limits,
            priority=priority,
            concurrency_key=concurrency_key,
            max_running=max_running,
        )

    def exists(self, workflow_id: str) -> bool:
        keys = self.keys
        return bool(
            self.redis.exists(keys.workflow(workflow_id))
            or self.redis.hexists(keys.compacted, workflow_id)
        )

    # -- reading -----------------------------------------------------------------

    def status(self, workflow_id: str) -> WorkflowStatus:
        """The workflow's state; :class:`UnknownWorkflow` when Redis holds no record of it
        (never started, deleted, or removed by retention)."""
        found = self._statuses([workflow_id])[0]
        if found is None:
            raise no_workflow(self.redis, self.keys, workflow_id)
        return found

    def statuses(self, workflow_ids: Sequence[str]) -> list[WorkflowStatus | None]:
        """The state of each workflow, in one round trip; None for an id with no record."""
        return self._statuses(list(workflow_ids)) if workflow_ids else []

    def select(self, selection: Selection) -> Iterator[WorkflowStatus]:
        """Every workflow that ``selection`` matches, oldest first, read a page at a time.

        Pages follow the index by score (creation time) and member, not by position, so
        workflows removed meanwhile (retention, another operator's delete) make none of
        the others be skipped."""
        index = self.keys.workflows
        if selection.schedule is not None:
            index = self.keys.schedule_runs(selection.schedule)  # scored by fire time
        after: tuple[float, str] | None = None  # the last (score, id) read
        tied = 0  # ids read at after's score: the most a page may repeat
        while True:
            low: str | float = "-inf" if after is None else after[0]
            # The index's score is the creation time: older_than bounds the read itself.
            high: str | float = (
                "+inf" if selection.created_before is None else f"({selection.created_before}"
            )
            rows: list[tuple[bytes, float]] = self.redis.zrangebyscore(  # type: ignore[assignment]
                index, low, high, start=0, num=_PAGE + tied, withscores=True
            )
            page = [(float(score), _text(member)) for member, score in rows]
            if after is not None:  # members of one score come in order: skip those read
                page = [row for row in page if row > after]
            if not page:
                return
            for status in self._statuses([workflow_id for _, workflow_id in page]):
                if status is not None and selection.matches(status):
                    yield status
            last = page[-1][0]
            same = sum(1 for score, _ in page if score == last)
            tied = same + (tied if after is not None and after[0] == last else 0)
            after = page[-1]

    # -- control -----------------------------------------------------------------

    def terminate(self, workflow_id: str, reason: str = "terminated", wait: float = 0.0) -> Applied:
        """Stop the workflow: nothing new starts, running tasks see ``cancelled()``,
        queued ones are skipped; state ``terminated`` with ``reason``."""
        return self.control(ev.TERMINATE_WORKFLOW, workflow_id, reason or "terminated", wait)

    def pause(self, workflow_id: str, wait: float = 0.0) -> Applied:
        """No task starts until resumed; ends of running tasks are still recorded."""
        return self.control(ev.PAUSE_WORKFLOW, workflow_id, wait=wait)

    def resume(self, workflow_id: str, wait: float = 0.0) -> Applied:
        """Start what was held while paused, in the order it would have started."""
        return self.control(ev.RESUME_WORKFLOW, workflow_id, wait=wait)

    def restart(self, workflow_id: str, wait: float = 0.0) -> Applied:
        """A failed or terminated workflow runs on: the tasks that were running or failed
        start again as their next attempt; what ended well is not run again."""
        return self.control(ev.RESTART_WORKFLOW, workflow_id, wait=wait)

    def delete(self, workflow_id: str, wait: float = 0.0) -> Applied:
        """Remove an ended workflow's record from Redis (the archive keeps its history)."""
        return self.control(ev.DELETE_WORKFLOW, workflow_id, wait=wait)

    def control(self, kind: str, workflow_id: str, reason: str = "", wait: float = 0.0) -> Applied:
        """Send the control ``kind`` for one workflow after checking that its state allows
        it (:class:`UnknownWorkflow`, :class:`NotAllowed`); with ``wait`` seconds, wait
        until a lifecycle worker has applied it."""
        applied = self.apply(kind, [self.status(workflow_id)], reason, wait)[0]
        if applied.refused is not None:
            raise NotAllowed(f"cannot {_verb(kind)} workflow {workflow_id}: {applied.refused}")
        return applied

    def apply(
        self, kind: str, workflows: Sequence[WorkflowStatus], reason: str = "", wait: float = 0.0
    ) -> list[Applied]:
        """Send ``kind`` to each of ``workflows`` whose state allows it (pipelined) and,
        with ``wait`` seconds, wait for all of them together; one :class:`Applied` per
        workflow, in order, never raising for one workflow's state."""
        outcomes: list[Applied | None] = []
        sendable: list[WorkflowStatus] = []
        for status in workflows:
            why = ev.refusal(kind, status.state, status.restartable)
            if why == ev.ALREADY:
                outcomes.append(Applied(status.id, None, status.state, before=status.state))
            elif why is not None:
                outcomes.append(Applied(status.id, None, None, refused=why, before=status.state))
            else:
                outcomes.append(None)
                sendable.append(status)
        event_ids: list[str] = []
        for first in range(0, len(sendable), _PAGE):
            page = sendable[first : first + _PAGE]
            event_ids += self._send([ev.control(kind, w.id, reason) for w in page])
        seen = self._await(kind, sendable, wait) if wait > 0 else [None] * len(sendable)
        sent = iter(zip(sendable, event_ids, seen, strict=True))
        return [
            outcome if outcome is not None else _outcome(kind, *next(sent)) for outcome in outcomes
        ]

    def control_many(
        self, kind: str, workflows: Iterable[WorkflowStatus], reason: str = ""
    ) -> tuple[list[Applied], list[tuple[str, str]]]:
        """Send ``kind`` to each of ``workflows`` that allows it, pipelined; return what was
        sent and, for the others, (id, why not); those already so are in neither. Does
        not wait."""
        outcomes = self.apply(kind, list(workflows), reason)
        sent = [o for o in outcomes if o.event_id is not None]
        refused = [(o.workflow, o.refused) for o in outcomes if o.refused is not None]
        return sent, refused

    # -- internals ---------------------------------------------------------------

    def _send(self, events: list[dict[str, Any]]) -> list[str]:
        pipe = self.redis.pipeline(transaction=False)
        for event in events:
            pipe.xadd(
                self.keys.lifecycle,
                {name: orjson.dumps(value) for name, value in event.items()},  # type: ignore[misc]
            )
        return [i.decode() if isinstance(i, bytes) else str(i) for i in pipe.execute()]

    def _statuses(self, ids: list[str]) -> list[WorkflowStatus | None]:
        fields = (rec.STATE, rec.PAUSED, rec.VERSION, rec.ENDED, rec.NAME, rec.CONCURRENCY)
        statuses: list[WorkflowStatus | None] = []
        for workflow_id, (state, paused, version, ended, name, concurrency) in zip(
            ids, compact.read_fields(self.redis, self.keys, ids, fields), strict=True
        ):
            if state is None and version is None:
                statuses.append(None)
                continue
            try:
                data = orjson.loads(state) if state else {}
                status = str(data.get("status", rec.RUNNING))
                restartable = bool(data.get("stopped"))
                error = data.get("error")
            except (orjson.JSONDecodeError, AttributeError):
                status, restartable = rec.FAILED, False  # the lifecycle fails it on any event
                error = "its state cannot be read"
            status = rec.shown_state(status, paused is not None, rec.is_queued(concurrency))
            statuses.append(
                WorkflowStatus(
                    workflow_id,
                    status,
                    _version(version),
                    ended.decode() if ended else None,
                    restartable,
                    name.decode("utf-8", "replace") if name else None,
                    error if isinstance(error, str) and error else None,
                )
            )
        return statuses

    def _await(
        self, kind: str, befores: list[WorkflowStatus], timeout: float
    ) -> list[WorkflowStatus | str | None]:
        """Per workflow, its status once the lifecycle has applied ``kind`` (``deleted``
        for a delete), or None if not within ``timeout``; read a page at a time."""
        applied = _APPLIED[kind]
        deadline = time.monotonic() + timeout
        seen: list[WorkflowStatus | str | None] = [None] * len(befores)
        waiting = list(range(len(befores)))
        while waiting:
            still: list[int] = []
            for first in range(0, len(waiting), _PAGE):
                page = waiting[first : first + _PAGE]
                for i, now in zip(page, self._statuses([befores[i].id for i in page]), strict=True):
                    if now is None:
                        if kind == ev.DELETE_WORKFLOW:
                            seen[i] = "deleted"
                            continue
                    elif now.version > befores[i].version and applied(befores[i], now):
                        seen[i] = now
                        continue
                    still.append(i)
            waiting = still
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        return seen


def _outcome(
    kind: str, before: WorkflowStatus, event_id: str, now: WorkflowStatus | str | None
) -> Applied:
    """What became of one sent action, from the workflow before it and as seen after."""
    if not isinstance(now, WorkflowStatus):
        return Applied(before.id, event_id, now, before=before.state)
    # Pause, resume and terminate never end a workflow themselves; if it has ended, and
    # with one commit only, that commit was its own end and the lifecycle refused the
    # action. With more commits it cannot be told whether the action came first.
    overtaken = now.state in rec.ENDED_STATES and (
        (kind == ev.TERMINATE_WORKFLOW and now.state != rec.TERMINATED)
        or (kind in (ev.PAUSE_WORKFLOW, ev.RESUME_WORKFLOW) and now.version == before.version + 1)
    )
    return Applied(
        before.id, event_id, now.state, None, before.state, now.error, overtaken=overtaken
    )


# When the lifecycle has applied a control, as seen from the workflow's record (its
# version moved on too).
_APPLIED: dict[str, Callable[[WorkflowStatus, WorkflowStatus], bool]] = {
    ev.TERMINATE_WORKFLOW: lambda _, now: now.state in rec.ENDED_STATES,
    ev.PAUSE_WORKFLOW: lambda _, now: now.state != rec.RUNNING,
    ev.RESUME_WORKFLOW: lambda _, now: now.state != rec.PAUSED_STATE,
    ev.RESTART_WORKFLOW: lambda before, now: now.ended != before.ended,
    ev.DELETE_WORKFLOW: lambda _, now: False,
}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _version(raw: Any) -> int:
    """The record's version; -1 when it cannot be read (a corrupt record still gets a
    status: the lifecycle fails it, or deletes it, on its next event)."""
    try:
        return int(raw or 0)
    except ValueError:
        return -1


def _verb(kind: str) -> str:
    return kind.removesuffix("-workflow")
