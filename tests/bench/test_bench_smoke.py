"""The engine benchmark keeps working (a tiny run; no timing is asserted)."""

from pathlib import Path

import orjson

from bench.engine import main


def test_a_tiny_benchmark_run_finishes_every_workflow_and_writes_its_figures(
    tmp_path: Path,
) -> None:
    out = tmp_path / "figures.json"
    assert (
        main(["--workflows", "100", "--shape", "map10", "--json", str(out), "--stall", "20"]) == 0
    )
    figures = orjson.loads(out.read_bytes())
    for key in (
        "tasks",
        "wall_s",
        "tasks_per_s",
        "workflows_per_s",
        "redis_peak_memory_bytes",
        "redis_memory_per_workflow_bytes",
        "redis_commands_per_task",
        "finished",
        "failed",
        "stuck",
    ):
        assert key in figures
    assert (figures["finished"], figures["failed"], figures["stuck"]) == (100, 0, 0)
    assert figures["tasks"] == 100 * 12
    assert set(figures["cpu_s"]) == {"lifecycle", "noop", "receipts", "redis", "bench", "total"}
    assert figures["server"]
    # Every task is at least its start-task and its end-task: two XADDs, timed. (EVALSHA
    # runs only after a race between the two lifecycle workers: not in every run.)
    assert figures["redis_calls_per_task"]["xadd"] >= 2
    assert figures["redis_us_per_task"]["xadd"] > 0
