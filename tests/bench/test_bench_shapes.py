"""The growing shapes compile to what their names say; the benchmark's own checks
(no Redis)."""

import subprocess
import sys
from typing import Any

import pytest

from bench.rig import Rig
from bench.shapes import NESTING_DEPTH, join_text, nested_text, workload
from flowlang.compiler import compile_text
from flowlang.graph import NodeKind
from flowlang.limits import DEFAULT_LIMITS


def _tasks(text: str) -> list[str]:
    return [n.name or "" for n in compile_text(text).nodes if n.kind is NodeKind.TASK]


def test_the_join_shape_is_n_tasks_feeding_one() -> None:
    graph = compile_text(join_text(5))
    nodes = {n.id: n for n in graph.nodes}
    # A1|...|A5 → C is { A1 ... A5 } → C: the subflow's end waits for all five.
    (meet,) = [a for a, b in graph.edges if nodes[b].name == "C"]
    assert nodes[meet].kind is NodeKind.SUBFLOW_END
    assert sorted(str(nodes[a].name) for a, b in graph.edges if b == meet) == [
        f"A{i}" for i in range(1, 6)
    ]


def test_the_nested_shape_has_one_task_per_subflow_beyond_the_nesting_limit() -> None:
    items = NESTING_DEPTH * 2 + 3  # two full blocks and a short one
    graph = compile_text(nested_text(items))
    assert _tasks(nested_text(items)).count("B") == items
    starts = [n for n in graph.nodes if n.kind is NodeKind.SUBFLOW_START]
    assert len(starts) == items


def test_an_iteration_past_the_default_item_limit_raises_the_workers_limit() -> None:
    small, large = workload("iterate", 10), workload("iterate", DEFAULT_LIMITS.items + 1)
    assert small.worker_flags == () and small.tasks_per_workflow == 12
    assert large.worker_flags == ("--max-items", str(DEFAULT_LIMITS.items + 1))
    assert large.limits.items == DEFAULT_LIMITS.items + 1
    assert large.inputs(1)[0] == list(range(DEFAULT_LIMITS.items + 1))


def test_a_growing_shape_without_a_size_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="--shape join needs --items"):
        workload("join", None)


def test_a_growing_shape_of_no_items_is_one_line_on_stderr_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.engine import main

    assert main(["--shape", "iterate", "--items", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --shape iterate needs --items N (N at least 1), got 0\n"


def test_the_largest_worker_is_found_by_its_resident_memory() -> None:
    # What stops a run before one oversized workflow takes the machine's memory.
    code = (
        "import sys, time\n"
        "x = bytearray(60_000_000)\n"
        "x[::4096] = b'1' * len(x[::4096])  # every page touched: resident\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    big = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    small = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert big.stdout is not None and big.stdout.readline() == b"ready\n"
        nowhere: Any = None  # no server: only the processes are looked at
        rig = Rig(nowhere, nowhere, {"lifecycle": [small], "noop": [big]}, receipts=False)
        kind, rss = rig.largest_rss()
        assert kind == "noop" and rss > 60_000_000
    finally:
        for proc in (big, small):
            proc.kill()
            proc.wait()
