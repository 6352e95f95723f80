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


def test_a_tiny_soak_with_a_short_retention_ends_with_no_workflow_left(tmp_path: Path) -> None:
    from bench.soak import main as soak

    out = tmp_path / "soak.json"
    argv = ["--workflows", "200", "--rate", "400", "--retain", "1s", "--sample", "0.5"]
    assert soak([*argv, "--warmup", "50", "--json", str(out)]) == 0
    figures = orjson.loads(out.read_bytes())
    assert (figures["finished"], figures["failed"], figures["left_workflows"]) == (200, 0, 0)
    assert max(sample["workflows"] for sample in figures["curve"]) > 0  # they were kept a while
    assert figures["curve"][-1]["expiring"] == 0
