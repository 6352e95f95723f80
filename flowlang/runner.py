"""An in-memory runner: executes a graph with Python callables for tasks.

It is the executable specification of the language: it drives the same
:class:`~flowlang.machine.Machine` as the Redis engine, one task at a time in
start order, so its results are deterministic and the engine is tested
against it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flowlang.errors import FlowError
from flowlang.graph import Graph
from flowlang.limits import DEFAULT_LIMITS, Limits
from flowlang.machine import FAILED, Failed, Finished, Machine, StartTask, State

__all__ = ["RunResult", "TaskCall", "run"]


@dataclass(frozen=True, slots=True)
class TaskCall:
    """What a task implementation receives."""

    name: str
    input: Any
    params: Any
    key: str
    attempt: int
    kind: str  # "task", "source" or "sink"


TaskFunction = Callable[[TaskCall], Any]


@dataclass(slots=True)
class RunResult:
    status: str  # "finished", "failed" or "running" (stopped at max_tasks)
    output: Any
    error: str | None
    trace: list[tuple[str, str]] = field(default_factory=list)
    calls: list[TaskCall] = field(default_factory=list)

    def names(self) -> list[str]:
        """Names of the task calls, in the order they ran."""
        return [call.name for call in self.calls]


def run(
    graph: Graph,
    tasks: TaskFunction | Mapping[str, Callable[[Any, Any], Any]],
    input: Any = None,
    *,
    retries: int = 0,
    max_tasks: int = 100_000,
    limits: Limits = DEFAULT_LIMITS,
) -> RunResult:
    """Run ``graph`` to its end.

    ``tasks`` is a function of a :class:`TaskCall` (it also receives URI
    sources, ``kind="source"``, and sinks, ``kind="sink"``), or a mapping from
    task name to ``fn(input, params)``. An exception fails the task; it is
    retried up to ``retries`` times, then fails the workflow. ``max_tasks``
    bounds flows that loop forever. A transition that breaks ``limits`` fails the
    workflow with the error (``str()`` of the :class:`FlowError`, with its position),
    as the engine does.
    """
    call_task = _as_function(tasks)
    machine = Machine(graph, limits)
    state = State()
    result = RunResult(status="running", output=None, error=None)
    pending: deque[StartTask] = deque()

    def absorb(actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, StartTask):
                pending.append(action)
            elif isinstance(action, Finished):
                result.status, result.output = "finished", action.output
            elif isinstance(action, Failed):
                result.status, result.error = FAILED, action.reason

    try:
        absorb(machine.start(state, input, result.trace))
        while pending and state.status == "running" and len(result.calls) < max_tasks:
            task = pending.popleft()
            params = task.params if task.params is not None else {}  # as the engine sends them
            call = TaskCall(task.name, task.input, params, task.key, task.attempt, task.kind)
            result.calls.append(call)
            try:
                output = call_task(call)
            except Exception as error:  # a task implementation's failure, whatever it is
                retry = machine.invocation_attempt(state, task.key, task.attempt) <= retries
                absorb(
                    machine.task_failed(
                        state, task.key, task.attempt, str(error), retry, task.input
                    )
                )
                continue
            absorb(machine.task_ended(state, task.key, task.attempt, output, result.trace))
    except FlowError as error:  # a limit broken by a transition
        result.status, result.error = FAILED, str(error)
    return result


def _as_function(tasks: TaskFunction | Mapping[str, Callable[[Any, Any], Any]]) -> TaskFunction:
    if not isinstance(tasks, Mapping):
        return tasks

    def by_name(call: TaskCall) -> Any:
        function = tasks.get(call.name)
        if function is None:
            raise LookupError(f"no implementation for task {call.name!r}")
        return function(call.input, call.params)

    return by_name
