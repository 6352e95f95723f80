"""Cycles that can go round without starting a task are compile errors, placed at a node."""

from __future__ import annotations

import pytest

from flowlang.cli import EXIT_INVALID, main
from flowlang.compiler import compile_text
from flowlang.errors import FlowCycleError
from flowlang.graph import NodeKind


@pytest.mark.parametrize(
    ("flow", "line", "column", "named"),
    [
        ('<{"a":1}> → :start', 1, 1, '<{"a":1}>'),  # a literal feeding the start
        ("A\n<[1, 2]> → :start", 2, 1, "<[1,2]>"),  # beside a task that is not on the loop
        ("X → { <> → :start }", 1, 5, "{"),  # a subflow restarting itself from a literal
        ('? `$.go` { <{"go": 1}> } → :start', 1, 10, "{"),  # a guarded subflow may be passed by
        ("? `$.go` A → :start", 1, 10, "A"),  # a guarded task may be skipped
        ("* A → :start", 1, 3, "A"),  # an iteration over [] starts nothing
        ('<{"a": 1}> → :x; :x → ? `$.a` B → :x', 1, 31, "B"),  # through a label
    ],
)
def test_a_cycle_that_can_go_round_without_a_task_is_a_compile_error_at_a_node(
    flow: str, line: int, column: int, named: str
) -> None:
    with pytest.raises(FlowCycleError) as caught:
        compile_text(flow, "loop.flow")
    error = caught.value
    assert (error.line, error.column) == (line, column)
    assert str(error).startswith(f"loop.flow:{line}:{column}: {named} is on a cycle")
    assert "a workflow would loop forever" in str(error)


def test_the_message_names_the_guarded_tasks_that_may_start_nothing() -> None:
    with pytest.raises(FlowCycleError, match=r"\(A, B are guarded or iterated"):
        compile_text("? `$.a` A → ? `$.b` B → :start")


@pytest.mark.parametrize(
    "flow",
    [
        "A → B → :start",  # every lap starts A
        "? `$.a` A → B → :start",  # B always runs
        "L → *{ A → :start; B }",  # the inner loop starts A each time
        "<data.json> → :start",  # a URI source is a task (it is loaded by a worker)
        "A :x → B → :x C",  # no cycle at all
        "? `$.a` { A } → B → :start",
    ],
)
def test_cycles_that_start_a_task_on_every_lap_still_compile(flow: str) -> None:
    graph = compile_text(flow)
    assert graph.nodes[0].kind is NodeKind.START


def test_flowlang_check_prints_the_cycle_error_on_one_line(tmp_path, capsys) -> None:
    path = tmp_path / "spin.flow"
    path.write_text('A\n<{"a":1}> → :start\n', encoding="utf-8")
    assert main(["check", str(path)]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert err == (
        f'{path}:2:1: <{{"a":1}}> is on a cycle that can go round without starting a task; '
        "a workflow would loop forever\n"
    )
