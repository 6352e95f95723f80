"""The in-memory runner: the executable specification of §6–§8."""

from typing import Any

import pytest

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall, run

MULTI = (
    "A → { ? `$[?(@.status=0)]` B\n      ? `$[?(@.status>0)]` C\n      ? `$[?(@.status>1)]` D } → E"
)


def status_then_echo(status: int):
    def task(call: TaskCall) -> Any:
        return {"status": status} if call.name == "A" else {"by": call.name}

    return task


@pytest.mark.parametrize(
    ("flow", "status", "ran", "output"),
    [
        # The spec's four guard examples, each with a matching and a failing input.
        ("A → ? `$[?(@.status=0)]` B", 0, ["A", "B"], {"by": "B"}),
        ("A → ? `$[?(@.status=0)]` B", 1, ["A"], {"status": 1}),
        ("A → ? `$[?(@.status=0)]` B → C", 0, ["A", "B", "C"], {"by": "C"}),
        ("A → ? `$[?(@.status=0)]` B → C", 1, ["A", "C"], {"by": "C"}),
        ("A → ? `$[?(@.status=0)]` { B → C }", 0, ["A", "B", "C"], {"by": "C"}),
        ("A → ? `$[?(@.status=0)]` { B → C }", 1, ["A"], {"status": 1}),
        (MULTI, 0, ["A", "B", "E"], {"by": "E"}),
        (MULTI, 1, ["A", "C", "E"], {"by": "E"}),
        (MULTI, 2, ["A", "C", "D", "E"], {"by": "E"}),
    ],
)
def test_guard_trace(flow: str, status: int, ran: list[str], output: object) -> None:
    result = run(compile_text(flow), status_then_echo(status))
    assert (result.status, result.names(), result.output) == ("finished", ran, output)


def test_a_skipped_step_counts_as_ended_and_passes_its_input_on() -> None:
    result = run(
        compile_text("A → ? `$.missing` B → C"),
        lambda c: {"seen": c.input} if c.name == "C" else {"a": 1},
    )
    assert result.output == {"seen": {"a": 1}}
    assert ("skip", "2") in result.trace


@pytest.mark.parametrize(
    ("items", "output"),
    [([], []), ([1], [{"item": 1}]), ([3, 1, 2], [{"item": 3}, {"item": 1}, {"item": 2}])],
)
def test_iteration_runs_the_step_per_item_and_keeps_item_order(items: list, output: list) -> None:
    def task(call: TaskCall) -> Any:
        return items if call.name == "A" else {"item": call.input}

    result = run(compile_text("A → * B"), task)
    assert result.status == "finished"
    assert result.output == output
    assert result.names().count("B") == len(items)


def test_iterated_items_end_out_of_order_and_outputs_stay_in_item_order() -> None:
    from flowlang.machine import Machine, StartTask, State

    graph = compile_text("A → * B")
    machine, state = Machine(graph), State()
    (a,) = machine.start(state)
    starts = machine.task_ended(state, a.key, a.attempt, ["x", "y", "z"])
    assert [s.input for s in starts if isinstance(s, StartTask)] == ["x", "y", "z"]
    for task in reversed(starts):
        actions = machine.task_ended(state, task.key, task.attempt, {"out": task.input})
    assert actions[-1].output == [{"out": "x"}, {"out": "y"}, {"out": "z"}]


def test_iterating_a_subflow_runs_it_afresh_per_item() -> None:
    def task(call: TaskCall) -> Any:
        return [1, 2] if call.name == "A" else {call.name: call.input}

    result = run(compile_text("A → * { B → C } → D"), task)
    assert result.output == {"D": [{"C": {"B": 1}}, {"C": {"B": 2}}]}


def test_nested_iteration_builds_nested_lists() -> None:
    def task(call: TaskCall) -> Any:
        if call.name == "A":
            return [[1, 2], [3]]
        return call.input if call.name == "B" else call.input * 10

    result = run(compile_text("A → * { B → * C }"), task)
    assert result.output == [[10, 20], [30]]


def test_iterating_a_non_list_fails_the_workflow_with_the_reason() -> None:
    result = run(compile_text("A → * B"), lambda c: {"not": "a list"})
    assert result.status == "failed"
    assert "cannot iterate over an object" in result.error


def test_a_join_receives_inputs_in_flow_text_order() -> None:
    result = run(
        compile_text("A → :x D; B → :x; C → :x"), lambda c: c.input if c.name == "D" else [c.name]
    )
    assert result.output == [["A"], ["B"], ["C"]]


def test_merge_turns_the_inputs_into_one_object() -> None:
    result = run(
        compile_text("A → :x > D; B → :x"),
        lambda c: c.input if c.name == "D" else {c.name: 1, "k": c.name},
    )
    assert result.output == {"A": 1, "B": 1, "k": "B"}


def test_merging_a_non_object_fails_the_workflow() -> None:
    result = run(compile_text("A → :x > D; B → :x"), lambda c: [1])
    assert result.status == "failed" and "cannot merge" in result.error


def test_merge_at_the_end_merges_the_workflow_output() -> None:
    result = run(compile_text("A → { B C } → > :end"), lambda c: {c.name: True})
    assert result.output == {"B": True, "C": True}


def test_flow_parameters_are_the_default_input_and_an_explicit_input_replaces_them() -> None:
    graph = compile_text("@flow f (- x: 1 -)\nA")
    assert run(graph, lambda c: c.input).output == {"x": 1}
    assert run(graph, lambda c: c.input, {"y": 2}).output == {"y": 2}


def test_a_task_that_returns_nothing_outputs_an_empty_object() -> None:
    assert run(compile_text("A → B"), lambda c: None).output == {}


def test_literal_sources_output_their_value_and_ignore_their_input() -> None:
    result = run(compile_text("<- customer: C123 -> → A"), lambda c: {"got": c.input})
    assert result.output == {"got": {"customer": "C123"}}


def test_uri_sources_and_sinks_are_tasks_of_their_own_kind() -> None:
    stored = {}

    def task(call: TaskCall) -> Any:
        if call.kind == "source":
            return [1, 2]
        if call.kind == "sink":
            stored[call.name] = call.input
            return call.input
        return call.input * 2

    result = run(compile_text("<items.json> → * A → <out.json>"), task)
    assert stored == {"out.json": [2, 4]} and result.output == [2, 4]


def test_a_cycle_starts_its_nodes_again() -> None:
    result = run(compile_text("A → B → C → :start; D → :end"), lambda c: {}, max_tasks=12)
    assert result.status == "running"
    assert result.names()[:8] == ["A", "D", "B", "C", "A", "D", "B", "C"]


def test_a_failing_task_is_retried_then_fails_the_workflow() -> None:
    calls = []

    def flaky(call: TaskCall) -> Any:
        calls.append(call.attempt)
        if call.attempt < 3:
            raise RuntimeError("boom")
        return {"ok": True}

    assert run(compile_text("A"), flaky, retries=2).output == {"ok": True}
    assert calls == [1, 2, 3]
    failed = run(compile_text("A → B"), lambda c: 1 / 0, retries=1)
    assert failed.status == "failed" and "division by zero" in failed.error
    assert failed.names() == ["A", "A"]


def test_a_duplicate_end_changes_nothing() -> None:
    from flowlang.machine import Machine, State

    machine, state = Machine(compile_text("A → B")), State()
    (a,) = machine.start(state)
    (b,) = machine.task_ended(state, a.key, a.attempt, {"x": 1})
    assert machine.task_ended(state, a.key, a.attempt, {"x": 1}) == []
    assert b.name == "B" and state.running == {b.key: 1}


def test_each_round_of_a_cycle_is_a_new_attempt_of_the_same_instance() -> None:
    result = run(compile_text("A → B → :start; C"), lambda c: {}, max_tasks=9)
    attempts = [(call.name, call.key, call.attempt) for call in result.calls if call.name == "A"]
    assert attempts == [("A", "1", 1), ("A", "1", 2), ("A", "1", 3)]
    rounds_of_c = [call.attempt for call in result.calls if call.name == "C"]
    assert rounds_of_c == list(range(1, len(rounds_of_c) + 1))


def test_nodes_on_or_after_a_cycle_are_found_and_others_are_not() -> None:
    from flowlang.machine import Machine

    graph = compile_text("A → B → :start; C → D")
    names = {n.id: n.name or str(n.kind) for n in graph.nodes}
    assert {names[n] for n in Machine(graph).cyclic} == {"start", "A", "B", "C", "D", "end"}
    graph = compile_text("X → { A → B → :start; C } → Y")
    names = {n.id: n.name or str(n.kind) for n in graph.nodes}
    assert {names[n] for n in Machine(graph).cyclic} >= {"A", "B", "Y"}
    assert "X" not in {names[n] for n in Machine(graph).cyclic}
    assert Machine(compile_text("A → { B C } → D")).cyclic == frozenset()
