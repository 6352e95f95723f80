"""The machine, the runner, the parser and the CLI keep to the Limits they are given."""

from __future__ import annotations

import time
from typing import Any

import pytest

from flowlang.cli import EXIT_INVALID, main
from flowlang.compiler import compile_text
from flowlang.graph import Graph, Node, NodeKind
from flowlang.limits import DEFAULT_LIMITS, LimitExceeded, Limits, RunawayLoop
from flowlang.machine import Machine, StartTask, State
from flowlang.runner import TaskCall, run


def literal_loop() -> Graph:
    """``A; <{"a":1}> → :start`` built by hand: the compiler refuses it, a stored graph
    (or one from an older compiler) may still hold it."""
    nodes = [
        Node(0, NodeKind.START, line=1, column=1),
        Node(1, NodeKind.TASK, name="A", line=1, column=1),
        Node(2, NodeKind.SOURCE, params={"a": 1}, line=2, column=1),
        Node(3, NodeKind.END, line=2, column=1),
    ]
    return Graph(nodes=nodes, edges=[(0, 1), (1, 3), (0, 2), (2, 0)])


def test_the_machine_takes_the_default_limits_unless_given_others() -> None:
    graph = compile_text("A")
    assert Machine(graph).limits is DEFAULT_LIMITS
    assert Machine(graph, Limits(visits=7)).limits.visits == 7


def test_a_loop_that_starts_no_task_raises_runaway_loop_at_its_node() -> None:
    machine = Machine(literal_loop(), Limits(visits=1000))
    started = time.perf_counter()
    with pytest.raises(RunawayLoop) as caught:
        machine.start(State())
    assert time.perf_counter() - started < 1.0
    error = caught.value
    assert (error.line, error.column) == (2, 1)
    assert str(error).startswith('2:1: runaway loop at <{"a":1}> (2): more than 1,000 visits')


def test_the_runner_fails_a_runaway_workflow_instead_of_spinning() -> None:
    result = run(literal_loop(), lambda call: {}, limits=Limits(visits=1000))
    assert result.status == "failed"
    assert result.error is not None and 'runaway loop at <{"a":1}>' in result.error


def test_visits_are_counted_per_step_so_a_long_loop_through_a_task_runs_on() -> None:
    laps = iter(range(100))

    def task(call: TaskCall) -> Any:
        return {"lap": next(laps)}

    result = run(compile_text("A → B → :start"), task, max_tasks=60, limits=Limits(visits=5))
    assert result.status == "running" and len(result.calls) == 60  # stopped by max_tasks only


@pytest.mark.parametrize(("flow", "named"), [("A → * B", "B (2)"), ("A → * { B → C }", "{ (2)")])
def test_an_iteration_over_more_items_than_the_limit_fails_naming_the_step_and_count(
    flow: str, named: str
) -> None:
    result = run(
        compile_text(flow),
        lambda call: list(range(11)) if call.name == "A" else {},
        limits=Limits(items=10),
    )
    assert result.status == "failed"
    assert result.error is not None
    assert f"{named}: * over 11 items, more than the limit of 10" in result.error
    assert result.names() == ["A"]


def test_an_iteration_at_the_item_limit_runs() -> None:
    result = run(
        compile_text("A → * B"),
        lambda call: list(range(10)) if call.name == "A" else call.input,
        limits=Limits(items=10),
    )
    assert (result.status, result.output) == ("finished", list(range(10)))


def test_task_starts_are_unlimited_by_default() -> None:
    assert DEFAULT_LIMITS.task_starts is None
    result = run(compile_text("A → B → :start"), lambda call: {}, max_tasks=50)
    assert result.status == "running" and len(result.calls) == 50


def test_a_workflow_past_its_task_starts_fails_naming_the_task() -> None:
    result = run(compile_text("A → B → :start"), lambda call: {}, limits=Limits(task_starts=5))
    assert result.status == "failed"
    assert result.names() == ["A", "B", "A", "B", "A"]
    assert (
        result.error
        == "1:5: B: the workflow has started 6 task instances, more than the limit of 5"
    )


def test_task_starts_count_every_item_of_an_iteration() -> None:
    flow = compile_text("A → * B")
    items = lambda call: [1, 2, 3] if call.name == "A" else {}  # noqa: E731
    assert run(flow, items, limits=Limits(task_starts=4)).status == "finished"
    failed = run(flow, items, limits=Limits(task_starts=3))
    assert failed.status == "failed" and "started 4 task instances" in (failed.error or "")


def test_the_count_of_task_starts_survives_the_state_round_trip() -> None:
    machine = Machine(compile_text("A → B → :start"), Limits(task_starts=3))
    state = State()
    [a] = machine.start(state)
    assert state.to_dict()["started"] == 1
    state = State.from_dict(state.to_dict())
    [b] = machine.task_ended(state, a.key, a.attempt, {})
    assert isinstance(b, StartTask) and state.started == 2
    assert "started" not in State().to_dict()  # nothing stored without the limit


def test_a_flow_text_past_flow_bytes_is_one_error_with_its_size() -> None:
    text = "A → B\n" * 20  # 8 bytes a line: the arrow is 3 bytes in UTF-8
    with pytest.raises(LimitExceeded) as caught:
        compile_text(text, "big.flow", Limits(flow_bytes=159))
    assert str(caught.value) == ("big.flow: the flow text is 160 bytes, more than the limit of 159")
    compile_text(text, "big.flow", Limits(flow_bytes=160))


def test_nested_task_bodies_doubling_past_the_node_limit_stop_in_one_error() -> None:
    """Each use of an @task body is a copy: 31 declarations of a few bytes each would
    compile to billions of nodes. The limit is met as nodes are made, naming the
    uses being copied."""
    lines = ["@task a0 { t → t }"]
    lines += [f"@task a{n} {{ a{n - 1} → a{n - 1} }}" for n in range(1, 31)]
    started = time.monotonic()
    with pytest.raises(LimitExceeded) as caught:
        compile_text("\n".join([*lines, "a30"]), "bomb.flow")
    assert time.monotonic() - started < 10  # bounded by the limit, not by 2**31
    message = str(caught.value)
    assert message.startswith("bomb.flow:1:12: the flow compiles to more than 100,000 nodes")
    assert "a30 → a29 → " in message and message.endswith("a1 → a0)")


def test_a_flow_within_the_node_limit_compiles_and_one_past_it_does_not() -> None:
    text = " | ".join(f"t{n}" for n in range(50)) + " → done"
    size = len(compile_text(text, "wide.flow").nodes)
    assert len(compile_text(text, "wide.flow", Limits(nodes=size)).nodes) == size
    with pytest.raises(LimitExceeded, match=f"more than {size - 1} nodes"):
        compile_text(text, "wide.flow", Limits(nodes=size - 1))


def test_flowlang_check_refuses_a_file_past_the_limit_in_one_line(tmp_path, capsys) -> None:
    path = tmp_path / "huge.flow"
    path.write_bytes(b"A\n" * (DEFAULT_LIMITS.flow_bytes // 2 + 1))
    assert main(["check", str(path)]) == EXIT_INVALID
    limit = f"{DEFAULT_LIMITS.flow_bytes:,}"
    assert (
        capsys.readouterr().err
        == f"{path}: the flow text is more than the limit of {limit} bytes\n"
    )
