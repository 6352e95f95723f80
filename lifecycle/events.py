"""The workflow event schema — the one place it is defined (documented in docs/events.md).

Events are flat dicts; on the wire each field is a JSON value (rqse's format).
Builders return dicts; parsers validate what arrives and raise
:class:`BadEvent` naming the event id and the offending field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lifecycle.errors import BadEvent

__all__ = [
    "END_TASK",
    "END_WORKFLOW",
    "FAILED_WORKFLOW",
    "RETRY_TASK",
    "START_TASK",
    "START_WORKFLOW",
    "TERMINATE_WORKFLOW",
    "TIMEOUT_TASK",
    "EndTask",
    "end_task",
    "parse_end_task",
    "parse_start_workflow",
    "parse_task_timer",
    "parse_terminate",
    "task_instance_id",
]

# Read by the lifecycle worker.
START_WORKFLOW = "start-workflow"
END_TASK = "end-task"
TERMINATE_WORKFLOW = "terminate-workflow"
RETRY_TASK = "retry-task"  # a durable timer fired: start the next attempt now
TIMEOUT_TASK = "timeout-task"  # a durable timer fired: the attempt ran out of time
# Written by the lifecycle worker.
START_TASK = "start-task"
END_WORKFLOW = "end-workflow"
FAILED_WORKFLOW = "failed-workflow"

LIFECYCLE_INPUTS = frozenset(
    {START_WORKFLOW, END_TASK, TERMINATE_WORKFLOW, RETRY_TASK, TIMEOUT_TASK}
)

SUCCESS, FAILURE = "SUCCESS", "FAILURE"


def task_instance_id(workflow: str, key: str, attempt: int) -> str:
    """The idempotency key of one task attempt: ``workflow/node[.item...]/attempt``."""
    return f"{workflow}/{key}/{attempt}"


def _field(event_id: str, event: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in event:
        raise BadEvent(f"event {event_id} ({event.get('kind')}): field {name!r} is missing")
    value = event[name]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        expected = (
            kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        )
        kind_name = event.get("kind")
        raise BadEvent(
            f"event {event_id} ({kind_name}): field {name!r} is {value!r}, expected {expected}"
        )
    return value


@dataclass(frozen=True, slots=True)
class StartWorkflow:
    workflow: str
    graph: str
    input: Any


def parse_start_workflow(event_id: str, event: dict[str, Any]) -> StartWorkflow:
    return StartWorkflow(
        _field(event_id, event, "workflow", str),
        _field(event_id, event, "graph", str),
        event.get("input"),
    )


@dataclass(slots=True)
class EndTask:
    """A task attempt ended. ``key``/``attempt`` are None for seed-style workers that
    only echo ``index``: the engine then takes the node's one running attempt.

    Not changed once parsed, but not ``frozen``: one is made per event, and a frozen
    dataclass sets each field through ``object.__setattr__`` (4x the cost)."""

    workflow: str
    key: str
    attempt: int | None
    success: bool
    output: Any
    error: str | None
    worker: str | None = None


def parse_end_task(event_id: str, event: dict[str, Any]) -> EndTask:
    workflow, key, attempt = event.get("workflow"), event.get("key"), event.get("attempt")
    status, worker = event.get("status"), event.get("worker")
    if (  # the common shape, as end_task() writes it: the checks below hold
        type(workflow) is str
        and type(key) is str
        and type(attempt) is int
        and status == SUCCESS
        and "error" not in event
        and (worker is None or type(worker) is str)
    ):
        output = event.get("output")
        return EndTask(workflow, key, attempt, True, output, None, worker)
    return _parse_end_task(event_id, event)


def _parse_end_task(event_id: str, event: dict[str, Any]) -> EndTask:
    workflow = _field(event_id, event, "workflow", str)
    if "key" in event:
        key = _field(event_id, event, "key", str)
    else:
        key = str(_field(event_id, event, "index", int))
    attempt = _field(event_id, event, "attempt", int) if "attempt" in event else None
    status = str(event.get("status", SUCCESS)).upper()
    if status not in (SUCCESS, FAILURE):
        raise BadEvent(
            f"event {event_id} (end-task): field 'status' is {event['status']!r}, "
            f"expected {SUCCESS!r} or {FAILURE!r}"
        )
    error = event.get("error")
    return EndTask(
        workflow,
        key,
        attempt,
        status == SUCCESS,
        event.get("output"),
        str(error) if error is not None else None,
        str(event["worker"]) if event.get("worker") is not None else None,
    )


@dataclass(frozen=True, slots=True)
class TaskTimer:
    workflow: str
    key: str
    attempt: int


def parse_task_timer(event_id: str, event: dict[str, Any]) -> TaskTimer:
    return TaskTimer(
        _field(event_id, event, "workflow", str),
        _field(event_id, event, "key", str),
        _field(event_id, event, "attempt", int),
    )


def end_task(
    start: dict[str, Any],
    output: Any = None,
    error: str | None = None,
    worker: str | None = None,
) -> dict[str, Any]:
    """The end-task event answering a start-task event: SUCCESS with ``output``,
    or FAILURE with ``error`` when one is given.

    Only what the engine reads: the task's ``name``, ``index`` and ``id`` follow
    from ``workflow``/``key``/``attempt`` and the start-task (every field costs on
    every hop: written, read by the lifecycle and by the receipts worker).
    """
    event: dict[str, Any] = {
        "kind": END_TASK,
        "workflow": start["workflow"],
        "key": start.get("key", str(start.get("index"))),
    }
    if "attempt" in start:
        event["attempt"] = start["attempt"]
    if error is not None:
        event["status"] = FAILURE
        event["error"] = error
    else:
        event["status"] = SUCCESS
        event["output"] = output if output is not None else {}
    if worker is not None:
        event["worker"] = worker
    return event


def parse_terminate(event_id: str, event: dict[str, Any]) -> tuple[str, str]:
    return _field(event_id, event, "workflow", str), str(event.get("reason", "terminated"))
