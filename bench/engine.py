"""The engine benchmark: W workflows through N lifecycle workers and M no-op workers.

``python -m bench --workflows 10000 --shape chain10`` starts a private Redis
(the server the tests use), the workers as separate processes, submits every
workflow as fast as it can, waits until all have ended, and prints one table.
``python -m bench --shape iterate --items N`` runs one workflow that grows with
N instead (also ``join``, ``nested``: bench/shapes.py). ``python -m bench
latency`` times single-task workflows submit→finished (bench/latency.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis

from bench.rig import (
    KEYS,
    add_packing_arguments,
    add_rig_arguments,
    at_least_one,
    ended_count,
    process_cpu_seconds,
    redis_cpu_seconds,
    server_name,
    spawn,
    start_rig,
    stop_processes,
    stored_memory,
    wait_trimmed,
)
from bench.shapes import GROWING, SHAPES, Workload, workload
from flowlang.compiler import compile_text
from flowlang.errors import FlowError
from lifecycle.keys import DEFAULT_KIND
from lifecycle.kind_limits import set_kind_limit
from lifecycle.submit import start_workflows
from rqse import fastpipe
from rqse.server import PERSISTENCE_OPTIONS

# The other benchmarks import these from here.
__all__ = [
    "KEYS",
    "SHAPES",
    "Figures",
    "default_lifecycle_workers",
    "ended_count",
    "main",
    "redis_cpu_seconds",
    "spawn",
    "stop_processes",
    "throughput",
]


_cpu_seconds = process_cpu_seconds  # the name bench.noop_workers imports


@dataclass
class Figures:
    shape: str
    server: str
    workflows: int
    tasks: int
    wall_s: float
    tasks_per_s: float
    workflows_per_s: float
    submit_per_s: float
    redis_peak_memory_bytes: int
    redis_memory_per_workflow_bytes: float
    redis_commands_per_task: float
    finished: int
    failed: int
    stuck: int
    # Growing shapes: the size, wall time per item, and the flow's parse + compile time.
    items: int | None = None
    per_item_us: float | None = None
    compile_s: float = 0.0
    # Redis memory (used_memory less the clients' buffers) once every workflow ended and
    # the streams were trimmed, minus the baseline taken after the warm-up, per workflow.
    redis_baseline_bytes: int = 0
    redis_retained_per_workflow_bytes: float | None = None
    streams_trimmed: bool = False
    gave_up: str | None = None  # why the run stopped before every workflow ended
    peak_stream_length: dict[str, int] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    redis_us_per_task: dict[str, float] = field(default_factory=dict)  # by command
    redis_calls_per_task: dict[str, float] = field(default_factory=dict)
    lifecycle_workers: int = 1
    pack_answers: bool = False  # the no-op workers sent their answers packed (end-tasks)
    pack_starts: bool = False  # the lifecycle workers sent start-tasks packed (start-tasks)


# The wait loop reads what ends the wait (the outcome counters) and the stream lengths
# (for their peaks) every TICK, and what only guards against a run gone wrong (no
# progress, a worker's memory) every GUARD_EVERY: read at every tick, the guards cost
# the bench more CPU than anything else it does once it has submitted.
TICK = 0.05
GUARD_EVERY = 0.5


def _watch(send: fastpipe.Send, priority: int = 0) -> tuple[int, dict[str, int]]:
    """Workflows ended (finished, failed or terminated) and the stream lengths, in one
    round trip of a :func:`rqse.fastpipe.session` (no connection taken from the pool
    and given back at every tick)."""
    outcomes, lifecycle, tasks = send(
        [
            ("HMGET", KEYS.outcomes, "finished", "failed", "terminated"),
            ("XLEN", KEYS.lifecycle),
            ("XLEN", KEYS.tasks("default", priority)),
        ]
    )
    return sum(int(count or 0) for count in outcomes), {"lifecycle": lifecycle, "tasks": tasks}


def _progress(client: redis.Redis) -> int:
    """Entries ever added to the lifecycle stream plus those its groups have read: any
    step of any workflow adds one, and a lifecycle worker busy with one large workflow
    reads its next batch (adding nothing for a while) when it is done with the last."""
    pipe = client.pipeline(transaction=False)
    pipe.xinfo_stream(KEYS.lifecycle)
    pipe.xinfo_groups(KEYS.lifecycle)
    stream, groups = pipe.execute()
    read = sum(int(group.get("entries-read") or 0) for group in groups)
    return int(stream["entries-added"]) + read


def _wait_settled(client: redis.Redis, timeout: float = 60.0) -> None:
    """Until Redis memory stops falling (two readings a second apart within 0.5 %)."""
    deadline = time.perf_counter() + timeout
    last = stored_memory(client)
    while time.perf_counter() < deadline:
        time.sleep(1.0)
        now = stored_memory(client)
        if abs(last - now) <= last * 0.005:
            return
        last = now


def _since(after: dict[str, Any], before: dict[str, Any]) -> dict[str, dict[str, float]]:
    """INFO commandstats ``calls`` and ``usec`` counted between two readings."""
    counted = {}
    for name, stats in after.items():
        earlier = before.get(name, {})
        calls = stats["calls"] - earlier.get("calls", 0)
        if calls:
            counted[name] = {"calls": calls, "usec": stats["usec"] - earlier.get("usec", 0)}
    return counted


def _per_task(
    commandstats: dict[str, Any], tasks: int, stat: str, smallest: float
) -> dict[str, float]:
    """One INFO commandstats figure (``usec``, ``calls``) per task, by command, largest
    first. Commands inside MULTI/EXEC and scripts count under their own names, and
    their time again in the EXEC or EVALSHA that ran them."""
    figures = {
        name.removeprefix("cmdstat_"): stats[stat] / max(tasks, 1)
        for name, stats in commandstats.items()
    }
    ranked = sorted(figures.items(), key=lambda item: -item[1])
    return {name: round(value, 3) for name, value in ranked if value >= smallest}


def _submission(args: argparse.Namespace) -> dict[str, Any]:
    """What ``--priority`` and ``--max-running`` ask of the submission."""
    options: dict[str, Any] = {"priority": args.priority}
    if args.max_running is not None:
        options.update(concurrency_key="bench", max_running=args.max_running)
    return options


def default_lifecycle_workers(shape: str) -> int:
    """Lifecycle workers when ``--lifecycle`` is not given. Many workflows: two, as one
    alone waits on its round trips to Redis for a third of the run (1M tasks: 33 s
    against 24 s for two) and a second fills those waits. One growing workflow: one, as
    two would race for it (100,000 items: 4.3 s against 5.0 s)."""
    return 1 if shape in GROWING else 2


def throughput(args: argparse.Namespace) -> Figures:
    if args.lifecycle is None:
        args.lifecycle = default_lifecycle_workers(args.shape)
    work: Workload = workload(args.shape, args.items)
    compiled = time.perf_counter()
    graph = compile_text(work.text, limits=work.limits)
    compile_s = time.perf_counter() - compiled
    inputs = work.inputs(args.workflows)
    with ExitStack() as stack:
        flags = work.worker_flags
        if args.keep_details is not None:
            flags += ("--keep-details", args.keep_details)
        rig = start_rig(stack, args, flags, args.persistence)
        client = rig.client
        if args.kind_limit is not None:
            set_kind_limit(client, KEYS, DEFAULT_KIND, args.kind_limit)
        warm_ended = rig.warm_up()
        # The server allocates each command's statistics at its first call: not the run's.
        watching = stack.enter_context(fastpipe.session(client))
        _watch(watching, args.priority), _progress(client), client.info("commandstats")
        baseline = stored_memory(client)
        # Counted as differences from here: CONFIG RESETSTAT would also free the server's
        # per-command latency histograms (about 190 kB), which the run then allocates
        # again, and the retained memory would count them.
        commands_before = client.info("commandstats")
        # CPU from here on: the workers' start-up (imports, connecting) is not the run's.
        cpu_before = rig.cpu()
        redis_before = redis_cpu_seconds(client)
        started, bench_cpu = time.perf_counter(), time.process_time()
        ids = [f"w{i}" for i in range(args.workflows)]
        start_workflows(client, graph, inputs, ids, KEYS, limits=work.limits, **_submission(args))
        submitted = time.perf_counter() - started
        peaks = {"lifecycle": 0, "tasks": 0}
        last_change, seen, next_guard = time.perf_counter(), 0, 0.0
        gave_up: str | None = None
        while True:
            ended, lengths = _watch(watching, args.priority)
            peaks = {name: max(peaks[name], lengths[name]) for name in peaks}
            if ended - warm_ended >= args.workflows:
                break
            time.sleep(TICK)
            now = time.perf_counter()
            if args.timeout and now - started > args.timeout:
                gave_up = f"timeout after {args.timeout:g} s"
                break
            if now < next_guard:
                continue
            next_guard = now + GUARD_EVERY
            # Progress is any lifecycle event added or read: with many workflows in flight
            # at once, none may finish for a long while although tasks end all the time.
            if (progress := _progress(client)) != seen:
                last_change, seen = now, progress
            elif now - last_change > args.stall:
                gave_up = f"no progress for {args.stall:g} s"
                break
            # One workflow too large for the engine can take a worker's memory past what
            # the machine has: the run stops before that (a shared machine's neighbours).
            rss_name, rss = rig.largest_rss()
            if args.max_rss_gb and rss > args.max_rss_gb * 1e9:
                gave_up = f"{rss_name} process over {args.max_rss_gb:g} GB RSS"
                break
        wall = time.perf_counter() - started
        cpu = rig.cpu_since(cpu_before)
        cpu["redis"] = round(redis_cpu_seconds(client) - redis_before, 2)
        cpu["bench"] = round(time.process_time() - bench_cpu, 2)
        cpu["total"] = round(sum(cpu.values()), 2)
        name = server_name(client, rig.server)
        commandstats = _since(client.info("commandstats"), commands_before)
        commands = sum(v["calls"] for v in commandstats.values())
        peak = int(client.info("memory")["used_memory_peak"])
        finished, failed = ended_count(client)
        finished -= warm_ended
        # What the finished workflows still hold: records, the workflow index, the
        # retention schedule, the graph. With the receipts worker, the streams' entries
        # are in the archive once it has trimmed them, so they are waited for and not
        # counted; without it they stay in Redis, and in the figure.
        trimmed = rig.receipts and gave_up is None and wait_trimmed(client)
        if args.keep_details is not None and gave_up is None:
            _wait_settled(client)  # compaction runs in the background after the end
        retained = (stored_memory(client) - baseline) / max(args.workflows, 1)
    tasks = finished * work.tasks_per_workflow
    return Figures(
        shape=args.shape,
        server=name,
        workflows=args.workflows,
        tasks=tasks,
        wall_s=round(wall, 2),
        tasks_per_s=round(tasks / wall, 1),
        workflows_per_s=round(finished / wall, 1),
        submit_per_s=round(args.workflows / submitted, 1),
        redis_peak_memory_bytes=peak,
        redis_memory_per_workflow_bytes=round(peak / max(args.workflows, 1), 1),
        redis_commands_per_task=round(commands / max(tasks, 1), 2),
        finished=finished,
        failed=failed,
        stuck=args.workflows - finished - failed,
        items=work.items,
        per_item_us=round(wall / work.items * 1e6, 2) if work.items else None,
        compile_s=round(compile_s, 3),
        redis_baseline_bytes=baseline,
        redis_retained_per_workflow_bytes=round(retained, 1),
        streams_trimmed=trimmed,
        gave_up=gave_up,
        peak_stream_length=peaks,
        cpu_s=cpu,
        redis_us_per_task=_per_task(commandstats, tasks, "usec", 0.05),
        redis_calls_per_task=_per_task(commandstats, tasks, "calls", 0.001),
        lifecycle_workers=args.lifecycle,
        pack_answers=args.pack_answers,
        pack_starts=args.pack_starts,
    )


def print_table(rows: dict[str, Any]) -> None:
    width = max(len(k) for k in rows) + 2
    for key, value in rows.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        print(f"{key:<{width}}{value}")


EPILOG = """examples:
  python -m bench --workflows 100000 --shape chain10 --lifecycle 2 --json out.json
  python -m bench --shape iterate --items 100000       # one workflow A → * B → C
  python -m bench latency --load 10000 --count 1000    # bench/latency.py
  python -m bench --cluster --partitions 6             # 1, 2, 3 masters (bench/cluster.py)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.splitlines()[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--workflows", type=at_least_one, default=None, help="default 1000 (growing: 1)"
    )
    shapes = sorted([*SHAPES, *GROWING])
    parser.add_argument("--shape", choices=shapes, default="chain10")
    parser.add_argument(
        "--items", type=int, help="size of a growing shape: " + ", ".join(sorted(GROWING))
    )
    add_rig_arguments(parser, lifecycle=None, lifecycle_help="2; 1 for a growing shape")
    parser.add_argument("--persistence", choices=sorted(PERSISTENCE_OPTIONS), default="none")
    parser.add_argument(
        "--stall", type=float, default=30.0, help="give up after this long without progress"
    )
    parser.add_argument("--timeout", type=float, help="give up after this many seconds in all")
    parser.add_argument(
        "--keep-details",
        metavar="DURATION",
        help="passed to the lifecycle workers (engines that compact finished workflows); "
        "the retained memory is then read once compaction has settled, e.g. 0",
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=0,
        help="every workflow's priority: its tasks go to the kind's priority stream",
    )
    parser.add_argument(
        "--max-running",
        type=int,
        metavar="N",
        help="every workflow under one concurrency key with at most N running: the gate's cost",
    )
    parser.add_argument(
        "--kind-limit",
        type=int,
        metavar="N",
        help="the tasks' kind limited to N running at once (lifecycle limit set): the slots' cost",
    )
    parser.add_argument(
        "--max-rss-gb",
        type=float,
        default=8.0,
        help="give up when a worker process holds more memory than this (default 8; 0: never)",
    )
    add_packing_arguments(parser)
    parser.add_argument("--json", help="also write the figures to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["latency"]:
        from bench.latency import main as latency

        return latency(arguments[1:])
    if any(a == "--cluster" or a.startswith("--cluster=") for a in arguments):
        from bench.cluster import main as cluster

        return cluster(arguments)
    if arguments[:1] == ["throughput"]:
        arguments = arguments[1:]
    parser = build_parser()
    args = parser.parse_args(arguments)
    if args.shape in GROWING and args.items is None:
        parser.error(f"--shape {args.shape} needs --items N")
    if args.shape not in GROWING and args.items is not None:
        parser.error(f"--items applies to {', '.join(sorted(GROWING))}, not --shape {args.shape}")
    if args.workflows is None:
        args.workflows = 1 if args.shape in GROWING else 1000
    try:
        figures = throughput(args)
    except (FlowError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = asdict(figures)
    print_table(rows)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    return 0
