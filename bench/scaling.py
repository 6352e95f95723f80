"""The scaling table: tasks/s and CPU per task for each count of workflows and of
lifecycle workers.

``python -m bench.scaling --workflows 1000,10000,100000,300000 --lifecycle 1,2,4``
runs ``python -m bench --shape chain10 --workflows W --lifecycle L`` for every
cell (a fresh server and workers each time, one run at a time) and prints one
row per cell: tasks/s, CPU µs per task summed over every process and by
process kind. Flat CPU µs per task down the table is what linear looks like;
the last line gives its spread (largest over smallest cell).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from bench.engine import build_parser, throughput
from bench.rig import add_packing_arguments, packing_flags, yardstick
from bench.sizes import parse_sizes

__all__ = ["cell", "main"]

KINDS = ("lifecycle", "noop", "receipts", "redis", "bench")


def cell(figures: dict[str, Any]) -> dict[str, Any]:
    """One row: throughput and CPU µs per task, in all and by process kind."""
    tasks = max(figures["tasks"], 1)
    per_task = {kind: figures["cpu_s"].get(kind, 0.0) / tasks * 1e6 for kind in KINDS}
    return {
        "workflows": figures["workflows"],
        "tasks": figures["tasks"],
        "wall_s": figures["wall_s"],
        "tasks_per_s": figures["tasks_per_s"],
        "cpu_us_per_task": figures["cpu_s"]["total"] / tasks * 1e6,
        "cpu_us_per_task_by_kind": per_task,
        "redis_commands_per_task": figures["redis_commands_per_task"],
        "stuck": figures["stuck"] + figures["failed"],
    }


def _line(lifecycle: int, row: dict[str, Any]) -> str:
    kinds = " / ".join(f"{row['cpu_us_per_task_by_kind'][k]:.1f}" for k in KINDS)
    return (
        f"{row['workflows']:>9,} {lifecycle:>3} {row['tasks_per_s']:>10,.0f} "
        f"{row['wall_s']:>8.2f} {row['cpu_us_per_task']:>8.1f}  {kinds:<34} "
        f"{row['redis_commands_per_task']:>5.2f} {row['stuck']:>5}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scaling",
        description=__doc__.splitlines()[0],
        epilog="example: python -m bench.scaling --workflows 1000,10000,100000 --lifecycle 1,2",
    )
    parser.add_argument("--workflows", type=parse_sizes, default=[1000, 10000], help="W,W,...")
    parser.add_argument("--lifecycle", type=parse_sizes, default=[1, 2], help="L,L,...")
    parser.add_argument("--workers", type=int, default=1, help="no-op worker processes")
    add_packing_arguments(parser)
    parser.add_argument("--json", help="also write every cell's figures to this file")
    args = parser.parse_args(argv)
    answers = "packed" if args.pack_answers else "one end-task per task"
    starts = "packed" if args.pack_starts else "one start-task per task"
    print(
        f"chain10, {args.workers} no-op worker(s), answers {answers}, starts {starts}; "
        f"yardstick {yardstick()} s"
    )
    print(
        f"{'W':>9} {'lc':>3} {'tasks/s':>10} {'wall s':>8} {'cpu µs':>8}  "
        f"{'µs/task ' + ' / '.join(KINDS):<34} {'cmds':>5} {'stuck':>5}"
    )
    cells: list[dict[str, Any]] = []
    for workflows in args.workflows:
        for lifecycle in args.lifecycle:
            bench_args = build_parser().parse_args(
                [
                    "--shape", "chain10",
                    "--workflows", str(workflows),
                    "--lifecycle", str(lifecycle),
                    "--workers", str(args.workers),
                    *packing_flags(args),
                ]
            )  # fmt: skip
            figures = asdict(throughput(bench_args))
            row = {"lifecycle": lifecycle, **cell(figures), "figures": figures}
            cells.append(row)
            print(_line(lifecycle, row), flush=True)
    costs = [row["cpu_us_per_task"] for row in cells if row["tasks"]]
    if len(costs) > 1:
        spread = max(costs) / min(costs)
        print(f"cpu µs per task: {min(costs):.1f} to {max(costs):.1f} ({spread:.2f}×)")
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(cells, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
