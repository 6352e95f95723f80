"""Latency: submit→finished of single-task workflows, idle or under a steady load.

``python -m bench latency --load 10000 --count 1000`` starts a private Redis,
a lifecycle worker, a no-op worker and the receipts worker (as ``python -m
bench`` does), and a feeder process that submits chain10 workflows at a steady
10,000 tasks/s (1,000 workflows a second, a few every 10 ms, catching up to the
clock when it falls behind). After a few seconds of that load, single-task
workflows are timed one at a time, from just before the submit to the moment
their end-workflow event is read from the lifecycle stream (XREAD blocking,
as ``python -m lifecycle run --wait`` follows a workflow). ``--load 0``: idle.

The figures say what rate the background actually achieved while the timing
ran: tasks ended per second (from the engine's outcome counters), next to what
was submitted.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import redis

from bench.engine import print_table
from bench.rig import (
    KEYS,
    add_packing_arguments,
    add_rig_arguments,
    redis_cpu_seconds,
    server_name,
    start_rig,
)
from bench.shapes import SHAPES
from flowlang.compiler import compile_text
from lifecycle.events import END_WORKFLOW
from lifecycle.submit import start_workflow, start_workflows

__all__ = ["main", "percentile"]

_END_WORKFLOW_JSON = orjson.dumps(END_WORKFLOW)
TICK_S = 0.01  # the feeder submits every 10 ms


def percentile(ordered: list[float], share: float) -> float:
    """The nearest-rank percentile of an ascending list (``share`` 0.99 for p99)."""
    rank = max(1, min(len(ordered), int(len(ordered) * share + 0.999999)))
    return ordered[rank - 1]


def _feed(url: str, tasks_per_s: float, submitted: Any, stop: Any) -> None:
    """The background load, in its own process: chain10 workflows at a steady rate."""
    text, tasks = SHAPES["chain10"]
    graph = compile_text(text)
    client = redis.Redis.from_url(url)
    per_s = tasks_per_s / tasks
    began, sent = time.perf_counter(), 0
    while not stop.is_set():
        due = int((time.perf_counter() - began) * per_s)
        if due > sent:
            ids = [f"load-{n}" for n in range(sent, due)]
            start_workflows(client, graph, [{"n": n} for n in range(sent, due)], ids, KEYS)
            sent = due
            submitted.value = sent
        # A tick's worth at a time: one round trip per tick, not per workflow.
        time.sleep(TICK_S)


def _time_one(client: redis.Redis, graph: Any, n: int, cursor: str) -> tuple[float, str]:
    """Milliseconds from submit to the workflow's end-workflow event; the new cursor."""
    workflow_id = f"timed-{n}"
    needle = orjson.dumps(workflow_id)
    began = time.perf_counter()
    start_workflow(client, graph, {"i": n}, workflow_id, KEYS)
    while True:
        reply: Any = client.xread({KEYS.lifecycle: cursor}, block=1000, count=1000)
        for _, entries in reply or []:
            for entry_id, fields in entries:
                cursor = entry_id.decode()
                if fields.get(b"workflow") == needle and fields.get(b"kind") == _END_WORKFLOW_JSON:
                    return (time.perf_counter() - began) * 1000, cursor


def _finished_load(client: redis.Redis, timed: int) -> int:
    """Background workflows that finished: every finished one but the timed ones."""
    return int(client.hget(KEYS.outcomes, "finished") or 0) - timed


def latency(args: argparse.Namespace) -> dict[str, Any]:
    graph = compile_text("A")
    tasks_per_workflow = SHAPES["chain10"][1]
    with ExitStack() as stack:
        rig = start_rig(stack, args)
        client = rig.client
        warm = rig.warm_up()
        stop = multiprocessing.Event()
        submitted = multiprocessing.Value("q", 0)
        if args.load > 0:
            feeder = multiprocessing.Process(
                target=_feed, args=(rig.server.url, args.load, submitted, stop), daemon=True
            )
            feeder.start()
            stack.callback(feeder.join, 10)
            stack.callback(stop.set)
            time.sleep(args.settle)  # reach the steady state before timing
        cursor = client.xinfo_stream(KEYS.lifecycle)["last-generated-id"].decode()
        load_before, submitted_before = _finished_load(client, warm), submitted.value
        cpu_before, redis_before = rig.cpu(), redis_cpu_seconds(client)
        began = time.perf_counter()
        samples = []
        for n in range(args.count):
            sample, cursor = _time_one(client, graph, n, cursor)
            samples.append(sample)
        elapsed = time.perf_counter() - began
        load_ended = _finished_load(client, warm + args.count) - load_before
        load_submitted = submitted.value - submitted_before
        cpu = rig.cpu_since(cpu_before)
        cpu["redis"] = round(redis_cpu_seconds(client) - redis_before, 2)
        cpu["total"] = round(sum(cpu.values()), 2)
        name = server_name(client, rig.server)
        backlog = client.xlen(KEYS.tasks("default"))
    samples.sort()
    return {
        "server": name,
        "count": len(samples),
        "load_target_tasks_per_s": args.load,
        "load_submitted_tasks_per_s": round(load_submitted * tasks_per_workflow / elapsed, 1),
        "load_achieved_tasks_per_s": round(load_ended * tasks_per_workflow / elapsed, 1),
        "p50_ms": round(statistics.median(samples), 2),
        "p90_ms": round(percentile(samples, 0.90), 2),
        "p99_ms": round(percentile(samples, 0.99), 2),
        "max_ms": round(samples[-1], 2),
        "timed_s": round(elapsed, 2),
        "task_stream_length_at_end": backlog,
        "cpu_s": cpu,
        "pack_answers": args.pack_answers,
        "pack_starts": args.pack_starts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench latency",
        description=__doc__.splitlines()[0],
        epilog="examples:\n  python -m bench latency --count 1000            # idle\n"
        "  python -m bench latency --load 10000 --count 1000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--count", type=int, default=500, help="workflows to time one by one")
    parser.add_argument(
        "--load", type=float, default=0, help="background tasks/s of chain10 workflows (0: idle)"
    )
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds of load before the timing starts"
    )
    add_rig_arguments(parser)
    add_packing_arguments(parser)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.count < 1 or args.load < 0:
        parser.error(
            f"--count must be at least 1 and --load at least 0, got {args.count}, {args.load}"
        )
    result = latency(args)
    print_table(result)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
