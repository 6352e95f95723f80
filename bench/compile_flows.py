"""How parse + compile time and memory grow with the size of a flow.

    python -m bench.compile_flows                      # 1,000, 10,000 and 100,000 tasks
    python -m bench.compile_flows --sizes 10000 100000

Three shapes of N tasks each:

* ``chain``  one statement ``T1 → T2 → … → TN``;
* ``fan``    ``A → { T1 T2 … } → Z``, one wide subflow;
* ``nested`` subflows four wide and up to six deep, chains of tasks at the leaves.

Each (shape, size) runs in a fresh interpreter so that ``maxrss`` is its own.
Time is the best of a few runs (one run at 100,000 tasks) without tracing;
memory is the ``tracemalloc`` peak of a separate traced run, and the growth of
the process's ``maxrss`` during the untraced runs. Bytes per task staying flat
as N grows is what "linear" looks like. A last line gives the deepest
``{ { … } }`` nesting that compiles under Python's default recursion limit.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

from flowlang.compiler import compile_flow, compile_text
from flowlang.parser import parse

SHAPES = ("chain", "fan", "nested")
DEFAULT_SIZES = (1_000, 10_000, 100_000)
TARGET_SECONDS = {10_000: 1.0, 100_000: 10.0}

NESTED_WIDTH = 4  # subflows per level
NESTED_DEPTH = 6  # nesting levels at most
NESTED_LEAF = 8  # a block of this many tasks or fewer is a plain chain


def chain(size: int) -> str:
    """One statement of ``size`` tasks."""
    return " → ".join(f"T{i}" for i in range(size))


def fan(size: int) -> str:
    """``A → { … } → Z`` with ``size`` tasks in all."""
    inner = " ".join(f"T{i}" for i in range(size - 2))
    return f"A → {{ {inner} }} → Z"


def nested(size: int) -> str:
    """Subflows ``NESTED_WIDTH`` wide and up to ``NESTED_DEPTH`` deep, ``size`` tasks in all."""
    names = (f"T{i}" for i in itertools.count())
    return _block(size, NESTED_DEPTH, names)


def _block(size: int, depth: int, names: Iterator[str]) -> str:
    if depth == 0 or size <= NESTED_LEAF:
        return " → ".join(next(names) for _ in range(size))
    inner = size - 2  # the block's own head and tail tasks
    parts = [
        inner // NESTED_WIDTH + (1 if i < inner % NESTED_WIDTH else 0) for i in range(NESTED_WIDTH)
    ]
    head = next(names)
    body = " ; ".join(_block(part, depth - 1, names) for part in parts if part)
    return f"{head} → {{ {body} }} → {next(names)}"


GENERATORS: dict[str, Callable[[int], str]] = {"chain": chain, "fan": fan, "nested": nested}


def measure(shape: str, size: int, with_gc: bool = True) -> dict[str, Any]:
    """Time and memory of compiling one generated flow, in this process."""
    text = GENERATORS[shape](size)
    compile_text("A → B")  # builds the cached Lark parser, which is not per-flow cost
    gc.collect()
    if not with_gc:
        gc.disable()
    rss_before = _maxrss_bytes()
    repeats = 1 if size >= 100_000 else 3
    best_parse = best_compile = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        flow = parse(text)
        parsed = time.perf_counter()
        graph = compile_flow(flow)
        done = time.perf_counter()
        best_parse = min(best_parse, parsed - started)
        best_compile = min(best_compile, done - parsed)
        counts = len(graph.tasks()), len(graph.nodes), len(graph.edges)
        del flow, graph
        gc.collect()  # explicit collections run even when automatic ones are disabled
    rss_growth = _maxrss_bytes() - rss_before
    tracemalloc.start()
    compile_text(text)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    tasks, nodes, edges = counts
    return {
        "shape": shape,
        "size": size,
        "tasks": tasks,
        "nodes": nodes,
        "edges": edges,
        "text_bytes": len(text.encode()),
        "parse_s": best_parse,
        "compile_s": best_compile,
        "peak_bytes": peak,
        "maxrss_growth_bytes": rss_growth,
    }


def _maxrss_bytes() -> int:
    scale = 1 if sys.platform == "darwin" else 1024  # Linux reports KiB, macOS bytes
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def deepest_nesting(limit: int = 5_000) -> tuple[int, str]:
    """The deepest ``A → { B → { … C } } → Z`` that compiles, and what the next depth raises."""

    def failure(depth: int) -> str | None:
        text = "A → " + "{ B → " * depth + "C" + " }" * depth + " → Z"
        try:
            compile_text(text)
        except Exception as error:  # reporting whatever breaks is the point
            inner = getattr(error, "orig_exc", None)
            name = type(error).__name__
            return f"{name} wrapping {type(inner).__name__}" if inner is not None else name
        return None

    low, high = 0, limit  # failure(low) is None; find the last depth that compiles
    if failure(high) is None:
        return high, "nothing (limit of the probe)"
    while high - low > 1:
        middle = (low + high) // 2
        if failure(middle) is None:
            low = middle
        else:
            high = middle
    return low, failure(high) or ""


def _run_worker(shape: str, size: int, with_gc: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.compile_flows", "--worker", shape, str(size)]
    if not with_gc:
        command.append("--without-gc")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {"shape": shape, "size": size, "error": last}
    return json.loads(result.stdout)


HEADER = (
    f"{'shape':<7} {'tasks':>8} {'text KB':>8} {'parse s':>8} {'compile s':>9} {'total s':>8} "
    f"{'µs/task':>8} {'peak MB':>8} {'B/task':>7} {'rss+ MB':>8}  target"
)


def _row(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"{result['shape']:<7} {result['size']:>8}  FAILED: {result['error']}"
    total = result["parse_s"] + result["compile_s"]
    target = TARGET_SECONDS.get(result["size"])
    verdict = (
        ""
        if target is None
        else (f"< {target:g} s ok" if total < target else f"> {target:g} s SLOW")
    )
    tasks, peak, rss = result["tasks"], result["peak_bytes"], result["maxrss_growth_bytes"]
    return (
        f"{result['shape']:<7} {tasks:>8} {result['text_bytes'] / 1e3:>8.0f} "
        f"{result['parse_s']:>8.3f} {result['compile_s']:>9.3f} {total:>8.3f} "
        f"{total / tasks * 1e6:>8.1f} {peak / 1e6:>8.1f} {peak / tasks:>7.0f} {rss / 1e6:>8.1f}"
        f"  {verdict}"
    )


def main(argv: list[str] | None = None) -> int:
    """Print one row per (shape, size); exit 1 when a size misses its time target."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.compile_flows",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), metavar="N")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument(
        "--without-gc",
        action="store_true",
        help="disable automatic garbage collection while compiling (shows its share of the time)",
    )
    parser.add_argument("--worker", nargs=2, metavar=("SHAPE", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        shape, size = args.worker
        print(json.dumps(measure(shape, int(size), with_gc=not args.without_gc)))
        return 0

    gc_state = "disabled" if args.without_gc else "enabled"
    print(
        f"Python {sys.version.split()[0]}, recursion limit {sys.getrecursionlimit()}, "
        f"automatic gc {gc_state}"
    )
    print(HEADER)
    slow = False
    for shape, size in itertools.product(args.shapes, args.sizes):
        result = _run_worker(shape, size, with_gc=not args.without_gc)
        print(_row(result), flush=True)
        total = result.get("parse_s", 0.0) + result.get("compile_s", 0.0)
        slow = slow or "error" in result or total >= TARGET_SECONDS.get(size, float("inf"))
    depth, failure = deepest_nesting()
    print(
        f"deepest {{ {{ … }} }} nesting that compiles: {depth} (depth {depth + 1} raises {failure})"
    )
    return 1 if slow else 0


if __name__ == "__main__":
    raise SystemExit(main())
