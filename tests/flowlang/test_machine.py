"""The machine's shortcut for plain steps takes the same transitions as its arrival queue.

``Machine.task_ended`` skips the arrival queue when every successor of the ended
node is a plain task (the engine's common step); with a ``trace`` it always
takes the queue. Driving two machines side by side, one traced and one not,
must give equal actions and equal states at every step, on any flow.
"""

from __future__ import annotations

from collections import deque
from dataclasses import astuple
from typing import Any

from hypothesis import given

from flowlang.compiler import compile_text
from flowlang.graph import Graph
from flowlang.machine import Machine, StartTask, State
from tests.flowlang.test_fuzz import FILE, FUZZ, valid_flows


def _output(task: StartTask, step: int) -> Any:
    # Lists half of the time, so iterations downstream have items to run.
    return [step, task.key] if step % 2 else {"step": step, "key": task.key}


def _drive_side_by_side(graph: Graph, max_steps: int = 300) -> int:
    """End tasks in start order on a traced and an untraced machine; assert they agree.
    Returns how many tasks ended."""
    machine = Machine(graph)
    traced, untraced = State(), State()
    trace: list[tuple[str, str]] = []
    first = machine.start(traced, {"in": 1}, trace)
    assert list(map(astuple, machine.start(untraced, {"in": 1}))) == list(map(astuple, first))
    queue = deque(a for a in first if isinstance(a, StartTask))
    steps = 0
    while queue and steps < max_steps:
        task = queue.popleft()
        output = _output(task, steps)
        expected = machine.task_ended(traced, task.key, task.attempt, output, trace)
        actual = machine.task_ended(untraced, task.key, task.attempt, output)
        assert list(map(astuple, actual)) == list(map(astuple, expected)), task.key
        assert untraced.to_dict() == traced.to_dict(), task.key
        queue.extend(a for a in expected if isinstance(a, StartTask))
        steps += 1
    return steps


def test_a_chain_takes_the_shortcut_and_ends_as_the_queue_would() -> None:
    graph = compile_text("A → B → C → D")
    machine = Machine(graph)
    plain = [machine.plain_next[node.id] for node in graph.nodes if node.name in ("A", "B")]
    assert all(plain), "A and B are followed by plain tasks"
    assert _drive_side_by_side(graph) == 4


def test_joins_guards_iterations_and_cycles_are_not_plain() -> None:
    graph = compile_text("A → { B C } → D → * E → ? `$[?(@.x=1)]` F")
    machine = Machine(graph)
    by_name = {node.name: node.id for node in graph.nodes if node.name}
    assert machine.plain_next[by_name["B"]] is None  # D joins two
    assert machine.plain_next[by_name["D"]] is None  # E iterates
    assert machine.plain_next[by_name["E"]] is None  # F has a guard
    cycle = compile_text("X → Y → :start; Z")
    by_name = {node.name: node.id for node in cycle.nodes if node.name}
    assert Machine(cycle).plain_next[by_name["X"]] is None  # Y is on the cycle


@FUZZ
@given(valid_flows())
def test_the_shortcut_and_the_arrival_queue_agree_on_any_flow(flow: Any) -> None:
    _drive_side_by_side(compile_text(flow.text, FILE))
