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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from flowlang.graph import Graph
from flowlang.limits import DEFAULT_LIMITS, Limits
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.errors import LifecycleError, NotAllowed, UnknownWorkflow
from lifecycle.keys import Keys
from lifecycle.submit import start_workflow

__all__ = ["Applied", "Client", "Selection", "WorkflowStatus"]

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


@dataclass(frozen=True, slots=True)
class Applied:
    """The outcome of one action: the event sent, and the state seen after it (None when
    the caller did not wait, or no lifecycle worker applied it in time; ``deleted``)."""

    workflow: str
    event_id: str | None  # None: nothing sent, the workflow already was so
    state: str | None


@dataclass(frozen=True, slots=True)
class Selection:
    """Which workflows a bulk action applies to: every given filter must match."""

    state: str | None = None
    flow: str | None = None

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in rec.SHOWN_STATES:
            raise LifecycleError(
                f"unknown state {self.state!r}: one of {', '.join(rec.SHOWN_STATES)}"
            )

    def matches(self, status: WorkflowStatus) -> bool:
        return (self.state is None or status.state == self.state) and (
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
    ) -> str:
        """Store ``graph`` and send its start-workflow; return the workflow id."""
        return start_workflow(self.redis, graph, input, workflow_id, self.keys, limits)

    def exists(self, workflow_id: str) -> bool:
        return bool(self.redis.exists(self.keys.workflow(workflow_id)))

    # -- reading -----------------------------------------------------------------

    def status(self, workflow_id: str) -> WorkflowStatus:
        """The workflow's state; :class:`UnknownWorkflow` when Redis holds no record of it
        (never started, deleted, or removed by retention)."""
        found = self._statuses([workflow_id])[0]
        if found is None:
            raise UnknownWorkflow(
                f"no workflow {workflow_id!r} in Redis (never started, deleted, or removed "
                "after its retention; a workflow just submitted appears once a lifecycle "
                "worker has started it)"
            )
        return found

    def select(self, selection: Selection) -> Iterator[WorkflowStatus]:
        """Every workflow that ``selection`` matches, oldest first, read a page at a time."""
        start = 0
        while True:
            ids = [
                member.decode() if isinstance(member, bytes) else str(member)
                for member in self.redis.zrange(self.keys.workflows, start, start + _PAGE - 1)
            ]
            if not ids:
                return
            for status in self._statuses(ids):
                if status is not None and selection.matches(status):
                    yield status
            start += _PAGE

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
        before = self.status(workflow_id)
        refusal = ev.refusal(kind, before.state, before.restartable)
        if refusal == ev.ALREADY:
            return Applied(workflow_id, None, before.state)
        if refusal is not None:
            raise NotAllowed(f"cannot {_verb(kind)} workflow {workflow_id}: {refusal}")
        event_id = self._send([ev.control(kind, workflow_id, reason)])[0]
        state = self._await(kind, before, wait) if wait > 0 else None
        return Applied(workflow_id, event_id, state)

    def control_many(
        self, kind: str, workflows: Iterable[WorkflowStatus], reason: str = ""
    ) -> tuple[list[Applied], list[tuple[str, str]]]:
        """Send ``kind`` to each of ``workflows`` that allows it, pipelined; return what was
        sent and, for the others, (id, why not). Does not wait."""
        sendable: list[str] = []
        refused: list[tuple[str, str]] = []
        for status in workflows:
            why = ev.refusal(kind, status.state, status.restartable)
            if why is None:
                sendable.append(status.id)
            elif why != ev.ALREADY:
                refused.append((status.id, why))
        sent: list[Applied] = []
        for first in range(0, len(sendable), _PAGE):
            ids = sendable[first : first + _PAGE]
            event_ids = self._send([ev.control(kind, w, reason) for w in ids])
            sent += [Applied(w, e, None) for w, e in zip(ids, event_ids, strict=True)]
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
        pipe = self.redis.pipeline(transaction=False)
        fields = (rec.STATE, rec.PAUSED, rec.VERSION, rec.ENDED, rec.NAME)
        for workflow_id in ids:
            pipe.hmget(self.keys.workflow(workflow_id), fields)
        statuses: list[WorkflowStatus | None] = []
        for workflow_id, (state, paused, version, ended, name) in zip(
            ids, pipe.execute(), strict=True
        ):
            if state is None and version is None:
                statuses.append(None)
                continue
            try:
                data = orjson.loads(state) if state else {}
                status = str(data.get("status", rec.RUNNING))
                restartable = bool(data.get("stopped"))
            except (orjson.JSONDecodeError, AttributeError):
                status, restartable = rec.FAILED, False  # the lifecycle fails it on any event
            if paused is not None and status == rec.RUNNING:
                status = rec.PAUSED_STATE
            statuses.append(
                WorkflowStatus(
                    workflow_id,
                    status,
                    int(version or 0),
                    ended.decode() if ended else None,
                    restartable,
                    name.decode("utf-8", "replace") if name else None,
                )
            )
        return statuses

    def _await(self, kind: str, before: WorkflowStatus, timeout: float) -> str | None:
        """The state once the lifecycle has applied ``kind``; None if not within ``timeout``."""
        applied = _APPLIED[kind]
        deadline = time.monotonic() + timeout
        while True:
            now = self._statuses([before.id])[0]
            if now is None:
                if kind == ev.DELETE_WORKFLOW:
                    return "deleted"
            elif now.version > before.version and applied(before, now):
                return now.state
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)


_APPLIED: dict[str, Callable[[WorkflowStatus, WorkflowStatus], bool]] = {
    ev.TERMINATE_WORKFLOW: lambda _, now: now.state in rec.ENDED_STATES,
    ev.PAUSE_WORKFLOW: lambda _, now: now.state != rec.RUNNING,
    ev.RESUME_WORKFLOW: lambda _, now: now.state != rec.PAUSED_STATE,
    ev.RESTART_WORKFLOW: lambda before, now: now.ended != before.ended,
    ev.DELETE_WORKFLOW: lambda _, now: False,
}


def _verb(kind: str) -> str:
    return kind.removesuffix("-workflow")
