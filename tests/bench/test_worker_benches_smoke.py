"""Tiny runs of the task-worker benchmarks: they finish and print their figures."""

from __future__ import annotations

import pytest


def test_phases_prints_each_phase_and_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.phases import main

    assert main(["--workflows", "20", "--commands"]) == 0
    out = capsys.readouterr().out
    noop = next(line for line in out.splitlines() if line.startswith("noop"))
    assert "events 200 " in noop  # chain10: ten tasks per workflow
    assert "xadd 1.000 calls" in out  # one end-task per task


def test_phases_under_a_concurrency_key_runs_every_task_and_counts_per_workflow(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.phases import main

    assert main(["--workflows", "20", "--max-running", "100", "--kind-limit", "3"]) == 0
    out = capsys.readouterr().out
    noop = next(line for line in out.splitlines() if line.startswith("noop"))
    assert "events 200 " in noop and "us_per_workflow" in noop


def test_answers_prints_every_write_shape(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.answers import SHAPES, main

    assert main(["--tasks", "400", "--batch", "50", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    for shape in SHAPES:
        assert any(line.startswith(f"{shape} ") for line in out.splitlines()), shape
    assert "lifecycle_entries 8 " in out  # packed: one entry per batch of 50


def test_noop_workers_times_every_setup(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.noop_workers import main

    assert main(["--tasks", "200"]) == 0
    rows = [
        line for line in capsys.readouterr().out.splitlines() if "tasks/s" in line or "/s " in line
    ]
    assert len(rows) == 5 and all("commands" in row for row in rows)
