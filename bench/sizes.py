"""Cost per item of one growing workflow, size after size: is it flat?

``python -m bench.sizes --shape iterate --items 1000,10000,100000`` runs
``python -m bench --shape iterate --items N`` for each N in turn (a fresh
server and workers each time) and prints one row per size: wall time per item,
CPU per item over every process, Redis peak. Flat columns down the table are
what linear looks like. Sizes stop after the first run that took longer than
``--max-wall`` seconds (or did not finish): the next one would take longer.
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
from bench.shapes import GROWING

__all__ = ["main", "parse_sizes", "row"]

COLUMNS = (  # figure, header, format (every column 10 wide)
    ("items", "items", "{:>10,}"),
    ("tasks", "tasks", "{:>10,}"),
    ("wall_s", "wall s", "{:>10.2f}"),
    ("per_item_us", "µs/item", "{:>10.1f}"),
    ("cpu_us_per_item", "cpu µs/it", "{:>10.1f}"),
    ("lifecycle_us_per_item", "lc µs/it", "{:>10.1f}"),
    ("redis_peak_mb", "peak MB", "{:>10.1f}"),
    ("compile_s", "compile s", "{:>10.2f}"),
    ("finished", "done", "{:>10}"),
)


def row(figures: dict[str, Any]) -> dict[str, Any]:
    """The table's columns from one run's figures."""
    items = max(figures["items"], 1)
    return {
        "items": figures["items"],
        "tasks": figures["tasks"],
        "wall_s": figures["wall_s"],
        "per_item_us": figures["per_item_us"],
        "cpu_us_per_item": figures["cpu_s"]["total"] / items * 1e6,
        "lifecycle_us_per_item": figures["cpu_s"]["lifecycle"] / items * 1e6,
        "redis_peak_mb": figures["redis_peak_memory_bytes"] / 1e6,
        "compile_s": figures["compile_s"],
        "finished": f"{figures['finished']}/{figures['workflows']}",
    }


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 1000,10000, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be at least 1, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sizes",
        description=__doc__.splitlines()[0],
        epilog="example: python -m bench.sizes --shape join --items 1000,10000 --lifecycle 2",
    )
    parser.add_argument("--shape", choices=sorted(GROWING), default="iterate")
    parser.add_argument("--items", type=parse_sizes, default=[1000, 10000, 100000], help="N,N,...")
    parser.add_argument(
        "--max-wall", type=float, default=60.0, help="no larger size after a run this long"
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="give up on one run after this long"
    )
    parser.add_argument(
        "--max-rss-gb", type=float, default=8.0, help="give up on a run whose worker holds more"
    )
    parser.add_argument("--lifecycle", type=int, default=1, help="lifecycle worker processes")
    add_packing_arguments(parser)
    parser.add_argument("--json", help="also write every run's figures to this file")
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    answers = "packed" if args.pack_answers else "one end-task per task"
    starts = "packed" if args.pack_starts else "one start-task per task"
    print(
        f"{args.shape}, {args.lifecycle} lifecycle worker(s), answers {answers}, starts {starts}; "
        f"yardstick {yardstick()} s"
    )
    print(" ".join(f"{header:>10}" for _, header, _ in COLUMNS))
    for items in args.items:
        bench_args = build_parser().parse_args(
            [
                "--shape", args.shape,
                "--items", str(items),
                "--workflows", "1",
                "--lifecycle", str(args.lifecycle),
                "--timeout", str(args.timeout),
                "--max-rss-gb", str(args.max_rss_gb),
                *packing_flags(args),
            ]
        )  # fmt: skip
        figures = asdict(throughput(bench_args))
        runs.append(figures)
        cells = row(figures)
        print(" ".join(fmt.format(cells[name]) for name, _, fmt in COLUMNS), flush=True)
        if figures["wall_s"] > args.max_wall or figures["finished"] < 1:
            later = [n for n in args.items if n > items]
            why = figures["gave_up"] or f"{figures['wall_s']} s"
            if later:
                print(f"stopped at {items:,} items ({why}); not run: {later}")
            elif figures["gave_up"]:
                print(f"gave up at {items:,} items: {why}")
            break
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(runs, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
