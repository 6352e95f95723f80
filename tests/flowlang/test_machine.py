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
from flowlang.machine import Machine, StartTask, State, parse_key
from tests.flowlang.generators import FILE, FUZZ, valid_flows


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


def _by_key(actions: list[Any]) -> dict[str, StartTask]:
    return {a.key: a for a in actions if isinstance(a, StartTask)}


def test_an_iteration_invoked_again_by_a_cycle_replaces_the_open_one() -> None:
    # C loops back before B's three items end; A's next output has one item only.
    machine = Machine(compile_text("A :a → * B → :start; :a → C → :start"))
    state = State()
    [a] = machine.start(state)
    first = _by_key(machine.task_ended(state, a.key, a.attempt, [1, 2, 3]))
    assert sorted(first) == ["2.0", "2.1", "2.2", "3"]
    [a] = machine.task_ended(state, "3", first["3"].attempt, {})
    again = _by_key(machine.task_ended(state, a.key, a.attempt, [9]))
    assert sorted(again) == ["2.0", "3"] and again["2.0"].attempt != first["2.0"].attempt
    for key in ("2.0", "2.1", "2.2"):  # the replaced items' ends change nothing
        before = state.to_dict()
        assert machine.task_ended(state, key, first[key].attempt, {"old": key}) == []
        assert state.to_dict() == before
    [a] = machine.task_ended(state, "2.0", again["2.0"].attempt, {"new": 9})
    assert a.name == "A" and a.input == [{"new": 9}]


def test_an_iterated_subflow_invoked_again_drops_its_open_items() -> None:
    machine = Machine(compile_text("A :a → * { B → D } → :start; :a → C → :start"))
    names = {n.id: n.name for n in machine.nodes}
    state = State()
    [a] = machine.start(state)
    first = _by_key(machine.task_ended(state, a.key, a.attempt, [1, 2]))
    assert sorted(names[parse_key(k)[0]] for k in first) == ["B", "B", "C"]
    c = next(t for t in first.values() if t.name == "C")
    [a] = machine.task_ended(state, c.key, c.attempt, {})
    again = _by_key(machine.task_ended(state, a.key, a.attempt, [5]))
    old_b = [t for t in first.values() if t.name == "B"]
    assert all(t.key not in state.running or state.running[t.key] != t.attempt for t in old_b)
    assert [t.input for t in again.values() if t.name == "B"] == [5]
