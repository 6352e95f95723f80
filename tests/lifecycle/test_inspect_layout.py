"""inspect reads at 80 columns and piped: every cell on one line, states and attempts
whole, long values shortened with an ellipsis, paused steps by name, a hint to --json."""

from __future__ import annotations

import re
from typing import Any

import pytest
import redis
from rich.console import Console

from flowlang.compiler import compile_text
from flowstream.cli import main
from lifecycle.cli import EXIT_OK
from lifecycle.cli.look import show_workflow
from lifecycle.client import Client
from lifecycle.inspect import describe_workflow
from lifecycle.keys import Keys
from tests.lifecycle.harness import Harness

KEYS = Keys()
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ERROR = "ValueError: order 4: negative quantity -1\n" + "  and a traceback line\n" * 5
LONG_INPUT = {"orders": [{"id": n, "qty": n * 3, "note": "x" * 20} for n in range(6)]}


def fail_b(call: Any) -> Any:
    if call.name == "B":
        raise ValueError(ERROR)
    return call.input


@pytest.fixture
def failed(harness: Harness) -> str:
    """A workflow with a long input whose second step failed with a multi-line error,
    and a third step that never started."""
    workflow_id = harness.submit(
        compile_text("shop:orders → B → subflow_guarded_step"), LONG_INPUT, "wf-wide"
    )
    harness.pump(fail_b)
    return workflow_id


def inspect_text(capsys: Any, redis_url: str, workflow_id: str) -> list[str]:
    code = main(["inspect", workflow_id, "--redis-url", redis_url])
    out = capsys.readouterr().out
    assert code == EXIT_OK
    return ANSI.sub("", out).splitlines()


def test_inspect_at_80_columns_keeps_every_row_on_one_line_and_states_whole(
    failed: str, redis_url: str, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("FORCE_COLOR", "1")  # as on a terminal
    lines = inspect_text(capsys, redis_url, failed)
    header = next(line for line in lines if line.startswith("key"))
    assert header.split()[:7] == ["key", "task", "state", "attempts", "started", "took", "worker"]
    assert "…" not in header
    rows = lines[lines.index(header) + 1 :]
    rows = rows[: next(i for i, r in enumerate(rows) if r.startswith("output:"))]
    assert len(rows) == 3  # one line per step: the error does not wrap
    assert all(len(row) <= 80 for row in [header, *rows]), [len(r) for r in [header, *rows]]
    states = [row.split()[2] for row in rows]
    assert states[:2] == ["ended", "failed"] and rows[2].split()[2:4] == ["not", "started"]
    assert rows[1].split()[3] == "1"  # attempts, whole
    # shortened on its line (how much of it shows depends on how wide the duration is)
    assert rows[1].rstrip().endswith("…") and "ValueError" in rows[1].split("harness")[1]
    assert lines[-1] == "(--json for every field)"


def test_inspect_piped_prints_tab_separated_lines_values_shortened_on_one_line(
    failed: str, redis_url: str, capsys: Any
) -> None:
    lines = inspect_text(capsys, redis_url, failed)  # capsys: not a terminal
    header = lines.index("KEY\tTASK\tSTATE\tATTEMPTS\tSTARTED\tTOOK\tWORKER\tINPUT\tOUTPUT")
    rows = [line.split("\t") for line in lines[header + 1 : header + 4]]
    assert all(len(row) == 9 for row in rows)
    orders, b, unstarted = rows
    assert orders[2:4] == ["ended", "1"] and orders[6] == "harness"
    assert len(orders[7]) == 100 and orders[7].endswith("…")  # the long input
    assert b[2] == "failed" and b[8].startswith("ValueError: order 4: negative quantity -1 and")
    assert "\n" not in b[8]
    assert unstarted[2:] == ["not started", "-", "-", "-", "-", "-", "-"]
    assert lines[-1] == "(--json for every field)"


@pytest.mark.parametrize("width", [60, 50])
def test_a_narrow_terminal_drops_the_least_needed_columns_never_state_or_attempts(
    failed: str, redis_client: redis.Redis, width: int
) -> None:
    console = Console(width=width, force_terminal=True, color_system=None)
    with console.capture() as captured:
        show_workflow(describe_workflow(redis_client, KEYS, failed), console)
    lines = captured.get().splitlines()
    header = next(line for line in lines if line.startswith("key"))
    assert "input" not in header.split() and "…" not in header
    assert {"state", "attempts", "took"} <= set(header.split())
    table = lines[lines.index(header) :]
    assert len(table) == 4 and all(len(line) <= width for line in table)
    assert [row.split()[2] for row in table[1:3]] == ["ended", "failed"]


def test_a_paused_workflow_names_its_held_steps_and_running_ones_show_no_worker(
    harness: Harness, redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    workflow_id = harness.submit(compile_text("A → { B C }"), {"n": 1}, "wf-held")
    harness.advance()  # A sent to its worker
    Client(redis_client).pause(workflow_id)
    harness.advance()
    lines = inspect_text(capsys, redis_url, workflow_id)
    assert "paused: no start-task held yet (the next one to start waits for resume)" in lines
    [a] = [line.split("\t") for line in lines if line.startswith("1\t")]
    assert (a[1], a[2], a[6]) == ("A", "running", "-")
    harness.work(lambda call: call.input)
    harness.advance()  # A ended: B and C are held
    lines = inspect_text(capsys, redis_url, workflow_id)
    [held] = [line for line in lines if line.startswith("paused:")]
    assert held == "paused: held start-tasks B (3), C (4) (resume releases them)"
