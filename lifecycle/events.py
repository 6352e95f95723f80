"""The workflow event schema — the one place it is defined (documented in docs/events.md).

Events are flat dicts; on the wire each field is a JSON value (rqse's format).
Builders return dicts; parsers validate what arrives and raise
:class:`BadEvent` naming the event id and the offending field.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from lifecycle.errors import BadEvent
from lifecycle.priorities import MAX_PRIORITY, MIN_PRIORITY
from lifecycle.records import FAILED, FINISHED, PAUSED_STATE, QUEUED_STATE, RUNNING, TERMINATED
from rqse import fastpipe

__all__ = [
    "ADMITTED",
    "ADMIT_SENT",
    "ADMIT_WORKFLOW",
    "CONTROLS",
    "DELETE_WORKFLOW",
    "KINDS",
    "PAUSE_WORKFLOW",
    "RESTART_WORKFLOW",
    "RESUME_WORKFLOW",
    "Control",
    "control",
    "parse_control",
    "LIFECYCLE_INPUTS",
    "ROLES",
    "END_TASK",
    "END_TASKS",
    "END_WORKFLOW",
    "FAILED_WORKFLOW",
    "RETRY_TASK",
    "START_TASK",
    "START_TASKS",
    "START_WORKFLOW",
    "TERMINATE_WORKFLOW",
    "TIMEOUT_TASK",
    "EndTask",
    "LifecycleInput",
    "StartWorkflow",
    "TaskTimer",
    "Terminate",
    "end_task",
    "end_workflow",
    "failed_workflow",
    "new_salt",
    "concurrency_problem",
    "parse_end_task",
    "parse_end_tasks",
    "unpacked_answers",
    "parse_input",
    "parse_start_workflow",
    "parse_task_timer",
    "parse_terminate",
    "start_task_template",
    "StartTaskTemplate",
    "start_task_piece",
    "start_tasks_fields",
    "parse_start_tasks",
    "unpacked_starts",
    "is_start_tasks",
    "start_workflow",
    "task_instance_id",
    "task_token",
    "task_tokens",
    "terminate_workflow",
    "timer_member",
    "end_task_template",
    "end_tasks_fields",
    "RECOVERED",
    "sent_again",
    "is_start_task",
    "admission_sent",
]

# Read by the lifecycle worker.
START_WORKFLOW = "start-workflow"
END_TASK = "end-task"
# A task worker's successful answers of one batch in one entry (``answers``: a list of
# ``[workflow, key, attempt, token, output]``): one XADD per batch instead of one per task.
END_TASKS = "end-tasks"
TERMINATE_WORKFLOW = "terminate-workflow"
# Control of one workflow by an operator (lifecycle.client): each an event like the rest.
PAUSE_WORKFLOW = "pause-workflow"  # start no task until resumed; ends are still recorded
RESUME_WORKFLOW = "resume-workflow"  # send the start-tasks held while paused, in order
RESTART_WORKFLOW = "restart-workflow"  # a failed or terminated workflow runs on
DELETE_WORKFLOW = "delete-workflow"  # remove an ended workflow's record
# Written by the concurrency gate (engine/scripts/gate.lua) in the commit that frees a
# place under a concurrency key: the queued workflow it names starts its tasks.
ADMIT_WORKFLOW = "admit-workflow"
# An admit-workflow's field, true when the gate admitted the workflow in the commit that
# queued it and sent its held start-tasks itself, in that transaction: the lifecycle worker
# acknowledges it with nothing left to do; replay and recover apply it as any admission.
# The gate writes one only for an offer without start-tasks (see ADMITTED).
ADMIT_SENT = "sent"
RETRY_TASK = "retry-task"  # a durable timer fired: start the next attempt now
TIMEOUT_TASK = "timeout-task"  # a durable timer fired: the attempt ran out of time
# Written by the lifecycle worker.
START_TASK = "start-task"
# The start-tasks of one lifecycle transaction for one task stream in one entry (``tasks``:
# a list of objects, each the fields of the start-task it stands for, ``kind`` left out):
# one XADD per stream and batch instead of one per task, for the kinds a lifecycle worker
# is told to pack (``--pack-starts``).
START_TASKS = "start-tasks"
END_WORKFLOW = "end-workflow"
FAILED_WORKFLOW = "failed-workflow"

CONTROLS = (
    TERMINATE_WORKFLOW, PAUSE_WORKFLOW, RESUME_WORKFLOW, RESTART_WORKFLOW, DELETE_WORKFLOW
)  # fmt: skip
LIFECYCLE_INPUTS = frozenset(
    {START_WORKFLOW, END_TASK, RETRY_TASK, TIMEOUT_TASK, ADMIT_WORKFLOW, *CONTROLS}
)
KINDS = (
    *sorted(LIFECYCLE_INPUTS), END_TASKS, START_TASK, START_TASKS, END_WORKFLOW, FAILED_WORKFLOW
)  # fmt: skip

SUCCESS, FAILURE = "SUCCESS", "FAILURE"
# What a resource task does (start-task ``role``): load a value, or store its input.
ROLES = ("source", "sink")

_dumps = orjson.dumps


def task_instance_id(workflow: str, key: str, attempt: int) -> str:
    """The idempotency key of one task attempt: ``workflow/node[.item...]/attempt``."""
    return f"{workflow}/{key}/{attempt}"


def new_salt() -> str:
    """A workflow's secret for its attempt tokens, chosen at submission."""
    return secrets.token_hex(16)


def task_token(salt: str, workflow: str, key: str, attempt: int) -> str:
    """The token a start-task carries and its end-task must echo.

    Keyed by the workflow's salt, which only the lifecycle stream and the workflow's
    hash hold: a worker that was not handed the attempt cannot answer it, and an answer
    meant for another attempt (a stale retry, another workflow) does not fit. Derived,
    not stored, so replay computes the same tokens from the archive.
    """
    data = f"{workflow}/{key}/{attempt}".encode()
    return hashlib.blake2b(data, key=salt.encode(), digest_size=8).hexdigest()


def task_tokens(salt: str, workflow: str, attempts: list[tuple[str, int]]) -> list[str]:
    """:func:`task_token` of each ``(key, attempt)`` of one workflow: the keyed hash is
    set up once and copied, a third cheaper than a hash keyed anew for each."""
    keyed = hashlib.blake2b(key=salt.encode(), digest_size=8)
    tokens = []
    for key, attempt in attempts:
        hashed = keyed.copy()
        hashed.update(f"{workflow}/{key}/{attempt}".encode())
        tokens.append(hashed.hexdigest())
    return tokens


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
    salt: str = ""  # empty for start-workflows written without one
    priority: int = 0  # lifecycle.priorities: which of its kinds' streams its tasks go to
    # (key, max running) when it runs under a concurrency key, else None
    concurrency: tuple[str, int] | None = None
    # its id was claimed in the workflows index when it was sent (a hint for how the
    # lifecycle reads what the id holds; never what decides whether it starts)
    claimed: bool = False


def start_workflow(
    workflow: str,
    graph: str,
    input: Any,
    salt: str | None = None,
    priority: int = 0,
    concurrency_key: str | None = None,
    max_running: int | None = None,
    claimed: bool = False,
) -> dict[str, Any]:
    """Ask the lifecycle to start ``workflow`` from the stored graph ``graph``.
    ``priority`` is written only when not 0 (events from before priorities are 0). With
    a ``concurrency_key``, it starts only once fewer than ``max_running`` workflows of
    that key run (it waits queued until then). ``claimed``: the sender put the id in the
    workflows index first (start_once.lua, schedules); written only when true."""
    event = {
        "kind": START_WORKFLOW,
        "workflow": workflow,
        "graph": graph,
        "input": input,
        "salt": new_salt() if salt is None else salt,
    }
    if priority:
        event["priority"] = priority
    if concurrency_key is not None:
        event["concurrency_key"] = concurrency_key
        event["max_running"] = max_running
    if claimed:
        event["claimed"] = True
    return event


def concurrency_problem(key: Any, max_running: Any) -> str | None:
    """What is wrong with a concurrency key and its max-running, None when nothing: both
    or neither, a non-empty string and a whole number >= 1."""
    if key is None and max_running is None:
        return None
    if not isinstance(key, str) or not key:
        return f"concurrency key {key!r}: expected a non-empty string with max running"
    if isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1:
        return (
            f"max running {max_running!r} of concurrency key {key!r}: expected a whole number >= 1"
        )
    return None


def parse_start_workflow(event_id: str, event: dict[str, Any]) -> StartWorkflow:
    salt = _field(event_id, event, "salt", str) if "salt" in event else ""
    priority = _field(event_id, event, "priority", int) if "priority" in event else 0
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise BadEvent(
            f"event {event_id} ({START_WORKFLOW}): field 'priority' is {priority}, "
            f"expected {MIN_PRIORITY}..{MAX_PRIORITY}"
        )
    concurrency = None
    if "concurrency_key" in event or "max_running" in event:
        key, most = event.get("concurrency_key"), event.get("max_running")
        problem = concurrency_problem(key, most)
        if problem is not None:
            raise BadEvent(f"event {event_id} ({START_WORKFLOW}): {problem}")
        concurrency = (key, most)
    claimed = _field(event_id, event, "claimed", bool) if "claimed" in event else False
    return StartWorkflow(
        _field(event_id, event, "workflow", str),
        _field(event_id, event, "graph", str),
        event.get("input"),
        salt,
        priority,
        concurrency,  # type: ignore[arg-type]  # checked by concurrency_problem
        claimed,
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
    token: str | None = None
    # One answer of an end-tasks entry: one to an attempt no longer running, with its
    # token, is taken as the entry delivered again (some of its answers committed before
    # a crash) and changes nothing, where a lone end-task's would be dead-lettered.
    packed: bool = False


def parse_end_task(event_id: str, event: dict[str, Any]) -> EndTask:
    workflow, key, attempt = event.get("workflow"), event.get("key"), event.get("attempt")
    status, worker, token = event.get("status"), event.get("worker"), event.get("token")
    if (  # the common shape, as end_task() writes it: the checks below hold
        type(workflow) is str
        and type(key) is str
        and type(attempt) is int
        and status == SUCCESS
        and "error" not in event
        and (worker is None or type(worker) is str)
        and (token is None or type(token) is str)
    ):
        output = event.get("output")
        return EndTask(workflow, key, attempt, True, output, None, worker, token)
    return _parse_end_task(event_id, event)


def parse_end_tasks(event_id: str, event: dict[str, Any]) -> tuple[list[EndTask], list[str]]:
    """The answers an ``end-tasks`` entry packs, each a successful :class:`EndTask`, and
    the reasons its malformed answers (skipped) are not."""
    answers = event.get("answers")
    if type(answers) is not list:
        raise BadEvent(
            f"event {event_id} (end-tasks): field 'answers' is {repr(answers)[:120]}, expected list"
        )
    worker = event.get("worker")
    if worker is not None and type(worker) is not str:
        worker = str(worker)
    parts, bad = [], []
    for n, answer in enumerate(answers):
        if (
            type(answer) is list
            and len(answer) == 5
            and type(answer[0]) is str
            and type(answer[1]) is str
            and type(answer[2]) is int
            and type(answer[3]) is str
        ):
            workflow, key, attempt, token, output = answer
            parts.append(EndTask(workflow, key, attempt, True, output, None, worker, token, True))
        else:
            bad.append(
                f"event {event_id} (end-tasks): answer {n} is {repr(answer)[:120]}, expected "
                "[workflow, key, attempt, token, output]"
            )
    return parts, bad


def unpacked_answers(event_id: str, event: dict[str, Any]) -> list[dict[str, Any]]:
    """The answers of an ``end-tasks`` entry (:data:`END_TASKS`), each as the end-task
    event it stands for (status SUCCESS, the entry's worker, ``packed`` true): what
    readers of the lifecycle stream and of the archive (replay, history) see in its
    place. Malformed answers are left out (the lifecycle dead-letters the entry, with
    their reasons); :class:`BadEvent` when ``answers`` is not a list."""
    parts, _ = parse_end_tasks(event_id, event)
    return [
        {
            "kind": END_TASK,
            "workflow": part.workflow,
            "key": part.key,
            "attempt": part.attempt,
            "token": part.token,
            "status": SUCCESS,
            "output": part.output,
            "worker": part.worker,
            "packed": True,
        }
        for part in parts
    ]


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
    token = _field(event_id, event, "token", str) if "token" in event else None
    return EndTask(
        workflow,
        key,
        attempt,
        status == SUCCESS,
        event.get("output"),
        str(error) if error is not None else None,
        str(event["worker"]) if event.get("worker") is not None else None,
        token,
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
    every hop: written, read by the lifecycle and by the receipts worker); the
    attempt's ``token`` is echoed, without which the lifecycle refuses the answer.
    """
    event: dict[str, Any] = {
        "kind": END_TASK,
        "workflow": start["workflow"],
        "key": start.get("key", str(start.get("index"))),
    }
    if "attempt" in start:
        event["attempt"] = start["attempt"]
    if "token" in start:
        event["token"] = start["token"]
    if error is not None:
        event["status"] = FAILURE
        event["error"] = error
    else:
        event["status"] = SUCCESS
        event["output"] = output if output is not None else {}
    if worker is not None:
        event["worker"] = worker
    return event


@dataclass(frozen=True, slots=True)
class Control:
    """An operator's command for one workflow: ``kind`` one of :data:`CONTROLS`;
    ``reason`` what the operator said (terminate records it as the workflow's error)."""

    workflow: str
    kind: str
    reason: str = ""


Terminate = Control  # the name terminate's record had before the other controls


def control(kind: str, workflow: str, reason: str = "") -> dict[str, Any]:
    """A control event (one of :data:`CONTROLS`) for ``workflow``."""
    if kind not in CONTROLS:
        raise ValueError(f"{kind!r} is not a control event (one of {', '.join(CONTROLS)})")
    event = {"kind": kind, "workflow": workflow}
    if reason:
        event["reason"] = reason
    return event


ALREADY = "already so"  # a repeated control (pause of a paused workflow): changes nothing


def refusal(kind: str, state: str, restartable: bool = True) -> str | None:
    """Why a workflow in ``state`` (``paused`` for a paused one) does not take the control
    ``kind``; :data:`ALREADY` when it is already what the control asks; None when it does.
    The one rule, checked by the client before sending and by the lifecycle on applying."""
    ended = state in (FINISHED, FAILED, TERMINATED)
    if kind == TERMINATE_WORKFLOW:
        if state == TERMINATED:
            return ALREADY
        return (
            f"the workflow has {state}; only a running or paused one can be terminated"
            if ended
            else None
        )
    if kind == PAUSE_WORKFLOW:
        if state == PAUSED_STATE:
            return ALREADY
        if state == QUEUED_STATE:
            return "the workflow is queued (waiting for its concurrency key); nothing runs yet"
        return f"the workflow has {state}; only a running one can be paused" if ended else None
    if kind == RESUME_WORKFLOW:
        if state == RUNNING:
            return ALREADY
        return None if state == PAUSED_STATE else f"the workflow has {state}; it is not paused"
    if kind == RESTART_WORKFLOW:
        if state not in (FAILED, TERMINATED):
            return f"the workflow is {state}; only a failed or terminated one can be restarted"
        if not restartable:
            return "nothing to restart: it failed outside any task (see its error)"
        return None
    if kind == DELETE_WORKFLOW:
        return None if ended else f"the workflow is {state}; terminate it before deleting it"
    raise ValueError(f"{kind!r} is not a control event")


def terminate_workflow(workflow: str, reason: str = "terminated") -> dict[str, Any]:
    return control(TERMINATE_WORKFLOW, workflow, reason)


def parse_control(event_id: str, event: dict[str, Any]) -> Control:
    kind = str(event.get("kind"))
    reason = _field(event_id, event, "reason", str) if "reason" in event else ""
    if kind == TERMINATE_WORKFLOW and not reason:
        reason = "terminated"
    return Control(_field(event_id, event, "workflow", str), kind, reason)


parse_terminate = parse_control


LifecycleInput = StartWorkflow | EndTask | TaskTimer | Control

_PARSERS: dict[str, Callable[[str, dict[str, Any]], LifecycleInput]] = {
    START_WORKFLOW: parse_start_workflow,
    END_TASK: parse_end_task,
    RETRY_TASK: parse_task_timer,
    TIMEOUT_TASK: parse_task_timer,
    **{kind: parse_control for kind in CONTROLS},
    ADMIT_WORKFLOW: parse_control,
}


def parse_input(event_id: str, kind: Any, event: dict[str, Any]) -> LifecycleInput | None:
    """The typed record of a lifecycle input of ``kind``; None for any other kind (the
    lifecycle's own end-workflow and failed-workflow, which change nothing)."""
    parse = _PARSERS.get(kind) if type(kind) is str else None
    return parse(event_id, event) if parse is not None else None


# -- Written by the lifecycle ----------------------------------------------------------


def end_workflow(workflow: str, output: Any) -> dict[str, Any]:
    return {"kind": END_WORKFLOW, "workflow": workflow, "output": output}


def failed_workflow(workflow: str, reason: str, status: str | None = None) -> dict[str, Any]:
    """The workflow failed (``status`` None) or ended otherwise (``terminated``)."""
    event = {"kind": FAILED_WORKFLOW, "workflow": workflow, "reason": reason}
    if status is not None:
        event["status"] = status
    return event


_START_TASK_JSON = _dumps(START_TASK)
_START_TASKS_JSON = _dumps(START_TASKS)


class StartTaskTemplate(fastpipe.Template):
    """A start-task's template (:func:`start_task_template`) and its :attr:`piece`: the
    same task as one object of a ``start-tasks`` pack (:func:`start_task_piece`), or
    None when the node's tasks go alone."""

    __slots__ = ("piece",)

    def __init__(self, *arguments: Any, packable: bool = True) -> None:
        super().__init__(*arguments)
        self.piece: bytes | None = start_task_piece(self) if packable else None


def start_task_template(
    stream: str,
    name: str,
    node: int,
    parameters: Any,
    role: str | None,
    priority: int = 0,
    *,
    packable: bool = True,
) -> StartTaskTemplate:
    """``XADD stream * <start-task>`` for every attempt of one node, packed once.

    Its slots, filled per attempt with JSON values: ``workflow``, ``key``, ``attempt``,
    ``id`` (:func:`task_instance_id`), ``token`` (:func:`task_token`), ``input``. A
    resource node's ``role`` (one of :data:`ROLES`) tells its worker what to do. The
    workflow's ``priority`` is written when not 0 (its stream already says it: for
    workers and tools that look at the task alone). ``packable`` False: its tasks never
    go in a ``start-tasks`` pack.
    """
    slot = fastpipe.SLOT
    fields: list[Any] = [
        b"kind", _START_TASK_JSON,
        b"workflow", slot,
        b"name", _dumps(name),
        b"index", _dumps(node),
        b"key", slot,
        b"attempt", slot,
        b"id", slot,
        b"token", slot,
        b"input", slot,
        b"parameters", _dumps(parameters),
    ]  # fmt: skip
    if role is not None:
        fields += (b"role", _dumps(role))
    if priority:
        fields += (b"priority", _dumps(priority))
    return StartTaskTemplate("XADD", stream, "*", *fields, packable=packable)


def start_task_piece(template: fastpipe.Template) -> bytes:
    """The start-task ``template`` fills, as one object of a ``start-tasks`` entry's
    ``tasks`` (its fields but ``kind``): a format of the template's slot values
    (``piece % (workflow, key, attempt, id, token, input)``, each JSON already)."""
    arguments = template.arguments[3:]  # after XADD stream *
    parts = []
    for at in range(0, len(arguments), 2):
        name, value = arguments[at], arguments[at + 1]
        if name == b"kind":
            continue
        if value is fastpipe.SLOT:
            shown = b"%b"
        else:
            assert isinstance(name, bytes) and isinstance(value, bytes), "JSON, as built above"
            shown = value.replace(b"%", b"%%")
        assert isinstance(name, bytes), "a start-task template names its fields in bytes"
        parts.append(_dumps(name.decode()) + b":" + shown)
    return b"{" + b",".join(parts) + b"}"


def start_tasks_fields(pieces: list[bytes]) -> tuple[bytes, ...]:
    """The fields of a ``start-tasks`` entry (:data:`START_TASKS`), flattened: each of
    ``pieces`` one start-task's fields as a JSON object (:func:`start_task_piece`)."""
    return (
        b"kind", _START_TASKS_JSON,
        b"tasks", b"[" + b",".join(pieces) + b"]",
    )  # fmt: skip


def parse_start_tasks(
    event_id: str, event: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The start-tasks a ``start-tasks`` entry packs, each the decoded start-task event
    it stands for, and the reasons its malformed ones (left out) are not: an object
    without a string ``workflow`` and ``name``. :class:`BadEvent` when ``tasks`` is not
    a list."""
    tasks = event.get("tasks")
    if type(tasks) is not list:
        raise BadEvent(
            f"event {event_id} (start-tasks): field 'tasks' is {repr(tasks)[:120]}, expected list"
        )
    starts, bad = [], []
    for n, task in enumerate(tasks):
        if (
            type(task) is dict
            and type(task.get("workflow")) is str
            and type(task.get("name")) is str
        ):
            start = {"kind": START_TASK, **task}
            start["kind"] = START_TASK  # first, and not a task's own say
            starts.append(start)
        else:
            bad.append(
                f"event {event_id} (start-tasks): task {n} is {repr(task)[:120]}, expected an "
                "object with string 'workflow' and 'name'"
            )
    return starts, bad


def unpacked_starts(event_id: str, event: dict[str, Any]) -> list[dict[str, Any]]:
    """The start-tasks of a ``start-tasks`` entry (:data:`START_TASKS`), each as the
    start-task event it stands for: what readers of task streams and of the archive
    (workers, replay, history, recover) see in its place, under the entry's id.
    Malformed ones are left out (:func:`parse_start_tasks` says why); :class:`BadEvent`
    when ``tasks`` is not a list."""
    return parse_start_tasks(event_id, event)[0]


# On a start-task sent again: by recover (lifecycle.audit.recover), or put back on its
# stream by a worker that stopped before running it. Replay checks it as the original.
RECOVERED = "recovered"


# On a start-task the concurrency gate sent itself, admitting its workflow in the commit
# that queued it (engine/scripts/gate.lua): that admission is written nowhere else, and
# replay applies it where the archive shows these start-tasks.
ADMITTED = "admitted"


def sent_again(start: dict[str, Any]) -> dict[str, Any]:
    """``start`` (a decoded start-task) as it goes back on its stream, marked as the same
    start-task sent again."""
    return {**start, RECOVERED: True}


def end_task_template(stream: str, worker: str) -> fastpipe.Template:
    """``XADD stream * <successful end-task>`` for a worker that answers without decoding.

    Its slots, filled with the start-task's own JSON values: ``workflow``, ``key``,
    ``attempt``, ``token``, ``output``.
    """
    slot = fastpipe.SLOT
    return fastpipe.Template(
        "XADD", stream, "*",
        b"kind", _dumps(END_TASK),
        b"workflow", slot,
        b"key", slot,
        b"attempt", slot,
        b"token", slot,
        b"status", _dumps(SUCCESS),
        b"output", slot,
        b"worker", _dumps(worker),
    )  # fmt: skip


def end_tasks_fields(worker: str, answers: list[bytes]) -> tuple[bytes, ...]:
    """The fields of an ``end-tasks`` entry (:data:`END_TASKS`), flattened, for a worker
    that answers without decoding: each of ``answers`` is ``[workflow,key,attempt,token,
    output]`` already in JSON (the start-task's own values)."""
    return (
        b"kind", _dumps(END_TASKS),
        b"worker", _dumps(worker),
        b"answers", b"[" + b",".join(answers) + b"]",
    )  # fmt: skip


def admission_sent(kind: Any, event: dict[str, Any]) -> bool:
    """Whether a decoded lifecycle event is an admit-workflow whose start-tasks the gate
    sent itself (:data:`ADMIT_SENT`): already applied live, applied again only by replay."""
    return kind == ADMIT_WORKFLOW and event.get(ADMIT_SENT) is True


def is_start_task(kind_field: bytes | None) -> bool:
    """Whether an entry's raw ``kind`` field names a start-task (read without decoding)."""
    return kind_field == _START_TASK_JSON


def is_start_tasks(kind_field: bytes | None) -> bool:
    """Whether an entry's raw ``kind`` field names a ``start-tasks`` pack."""
    return kind_field == _START_TASKS_JSON


def timer_member(kind: str, workflow: str, key: str, attempt: int) -> str:
    """A durable timer in ``{flow}:timers``: the ``retry-task`` or ``timeout-task`` event
    that ``fire_timers.lua`` appends to the lifecycle stream when it is due."""
    return _dumps({"kind": kind, "workflow": workflow, "key": key, "attempt": attempt}).decode()
