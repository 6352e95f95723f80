"""The benchmarks keep working (tiny runs; no timing is asserted)."""

from pathlib import Path

import orjson
import pytest

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
        "redis_retained_per_workflow_bytes",
        "finished",
        "failed",
        "stuck",
    ):
        assert key in figures
    assert (figures["finished"], figures["failed"], figures["stuck"]) == (100, 0, 0)
    assert figures["tasks"] == 100 * 12
    assert set(figures["cpu_s"]) == {"lifecycle", "noop", "receipts", "redis", "bench", "total"}
    assert figures["server"]
    # Finished workflows keep their records (retention is 7 days): something, and less
    # than the peak, which also held every stream entry in flight.
    assert figures["streams_trimmed"] is True
    assert figures["redis_retained_per_workflow_bytes"] > 0
    assert figures["redis_retained_per_workflow_bytes"] < figures["redis_memory_per_workflow_bytes"]
    # The lifecycle workers pack a batch's start-tasks in one XADD and the no-op workers
    # a batch's answers in another, by default: far fewer than one XADD per task.
    # (EVALSHA runs only after a race between the two lifecycle workers: not in every
    # run; its start-tasks go one XADD each.)
    assert (figures["pack_answers"], figures["pack_starts"]) == (True, True)
    assert 0 < figures["redis_calls_per_task"]["xadd"] < 1
    assert figures["redis_us_per_task"]["xadd"] > 0


def test_a_tiny_run_without_packed_starts_sends_one_start_task_per_task(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    argv = ["--workflows", "50", "--shape", "chain10", "--no-pack-starts"]
    assert main([*argv, "--json", str(out), "--stall", "20"]) == 0
    figures = orjson.loads(out.read_bytes())
    assert (figures["finished"], figures["failed"], figures["pack_starts"]) == (50, 0, False)
    assert 1 <= figures["redis_calls_per_task"]["xadd"] < 2


def test_a_tiny_run_without_packed_answers_sends_one_end_task_per_task(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    argv = ["--workflows", "50", "--shape", "chain10", "--no-pack-answers", "--no-pack-starts"]
    assert main([*argv, "--json", str(out), "--stall", "20"]) == 0
    figures = orjson.loads(out.read_bytes())
    assert (figures["finished"], figures["failed"], figures["pack_answers"]) == (50, 0, False)
    # Every task is its start-task and its end-task: two XADDs at least.
    assert figures["redis_calls_per_task"]["xadd"] >= 2


@pytest.mark.parametrize("argv", [["--lifecycle", "0"], ["--workers", "-1"], ["--workflows", "0"]])
def test_a_count_below_one_is_refused_in_one_line_before_anything_starts(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)  # (none of these would ever end: no worker, or nothing to wait for)
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"{argv[1]} is below 1")


def test_a_tiny_run_at_a_priority_under_a_key_and_a_kind_limit_finishes_every_workflow(
    tmp_path: Path,
) -> None:
    out = tmp_path / "figures.json"
    argv = ["--workflows", "60", "--shape", "chain10", "--priority", "4", "--max-running", "7"]
    argv += ["--kind-limit", "5"]  # the no-op worker takes and releases slots
    assert main([*argv, "--json", str(out), "--stall", "20"]) == 0
    figures = orjson.loads(out.read_bytes())
    assert (figures["finished"], figures["failed"], figures["stuck"]) == (60, 0, 0)
    assert figures["tasks"] == 60 * 10
    # Every workflow took a place under the key and gave it back when it ended (gate.lua:
    # SADD to the key's running set, SREM from it): one of each per workflow.
    assert figures["redis_calls_per_task"]["srem"] >= 60 / 600


def test_a_tiny_soak_with_a_short_retention_ends_with_no_workflow_left(tmp_path: Path) -> None:
    from bench.soak import main as soak

    out = tmp_path / "soak.json"
    argv = ["--workflows", "200", "--rate", "400", "--retain", "1s", "--sample", "0.5"]
    assert soak([*argv, "--warmup", "50", "--json", str(out)]) == 0
    figures = orjson.loads(out.read_bytes())
    assert (figures["finished"], figures["failed"], figures["left_workflows"]) == (200, 0, 0)
    assert max(sample["workflows"] for sample in figures["curve"]) > 0  # they were kept a while
    assert figures["curve"][-1]["expiring"] == 0


def test_one_iterating_workflow_runs_to_its_end_and_reports_its_time_per_item(
    tmp_path: Path,
) -> None:
    # The join shape is checked by its compiled graph (test_bench_shapes.py), the nested
    # one through bench.sizes below: each engine run costs seconds of start-up.
    items, tasks = 40, 42
    out = tmp_path / "figures.json"
    assert main(["--shape", "iterate", "--items", str(items), "--json", str(out)]) == 0
    figures = orjson.loads(out.read_bytes())
    assert (figures["workflows"], figures["finished"], figures["stuck"]) == (1, 1, 0)
    assert (figures["items"], figures["tasks"]) == (items, tasks)
    assert figures["wall_s"] > 0 and figures["tasks_per_s"] > 0
    # wall_s is rounded to 10 ms
    assert figures["per_item_us"] * items / 1e6 == pytest.approx(figures["wall_s"], abs=0.006)
    assert figures["redis_peak_memory_bytes"] > figures["redis_baseline_bytes"] > 0


def test_sizes_prints_one_row_per_size_of_a_subflow_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.sizes import main as sizes

    out = tmp_path / "sizes.json"
    assert sizes(["--shape", "nested", "--items", "3,6", "--json", str(out)]) == 0
    runs = orjson.loads(out.read_bytes())
    assert [(r["items"], r["finished"], r["tasks"]) for r in runs] == [(3, 1, 5), (6, 1, 8)]
    lines = capsys.readouterr().out.splitlines()
    assert "µs/item" in lines[1]
    assert [line.split()[0] for line in lines[2:]] == ["3", "6"]


def test_latency_under_load_reports_percentiles_and_the_rate_achieved(tmp_path: Path) -> None:
    out = tmp_path / "latency.json"
    argv = ["latency", "--count", "20", "--load", "2000", "--settle", "0.5", "--json", str(out)]
    assert main(argv) == 0
    figures = orjson.loads(out.read_bytes())
    assert figures["count"] == 20
    assert 0 < figures["p50_ms"] <= figures["p90_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert figures["load_submitted_tasks_per_s"] > 0
    assert figures["load_achieved_tasks_per_s"] > 0


def test_the_scaling_table_has_a_row_per_cell_with_cpu_per_task_by_process_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.scaling import main as scaling

    out = tmp_path / "scaling.json"
    assert scaling(["--workflows", "30", "--lifecycle", "2", "--json", str(out)]) == 0
    cells = orjson.loads(out.read_bytes())
    assert [(c["workflows"], c["lifecycle"], c["stuck"]) for c in cells] == [(30, 2, 0)]
    for c in cells:
        assert c["tasks"] == 300 and c["cpu_us_per_task"] > 0
        assert set(c["cpu_us_per_task_by_kind"]) == {
            "lifecycle",
            "noop",
            "receipts",
            "redis",
            "bench",
        }
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines[2:]] == [["30", "2"]]
