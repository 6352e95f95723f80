"""The engine on Redis Cluster: W chain10 workflows over P partitions, for 1, 2, 3 masters.

``python -m bench --cluster --partitions 6`` starts a local cluster of M masters
(no replicas) for each M of ``--masters`` (default 1, 2, 3) from the server binary
the tests use, runs the lifecycle workers, no-op workers and the receipts worker
against it with ``--cluster``, and prints one row per M with the ratio of its
throughput to one master's, measured in the same run. ``python -m bench --cluster
redis://host:7000 --partitions 6`` runs once against an existing cluster, or a
single server (P partitions on one Redis: what partitions cost); it flushes every
master first: never point it at one that holds data.

On one machine the masters share its cores with the workers; the figure that
carries over to a real cluster is how the cost per task splits between Redis and
the workers (docs/operations.md, Partitions and Redis Cluster).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis

from bench.rig import (
    add_packing_arguments,
    at_least_one,
    process_cpu_seconds,
    redis_cpu_seconds,
    spawn,
    stop_processes,
)
from flowlang.compiler import compile_text
from lifecycle.deployment import Deployment
from lifecycle.partitions import Partitions
from lifecycle.submit import start_workflows
from rqse.cluster import Connections
from rqse.connection import resolve_url
from rqse.server import LocalCluster

__all__ = ["main"]

CHAIN10 = " → ".join(f"T{n}" for n in range(10))
WARMUP = 30


@dataclass
class ClusterFigures:
    masters: int
    partitions: int
    workflows: int
    tasks: int
    wall_s: float
    tasks_per_s: float
    finished: int
    stuck: int
    ratio_to_one_master: float | None = None
    cpu_s: dict[str, float] = field(default_factory=dict)
    pack_answers: bool = False  # the no-op workers sent their answers packed (end-tasks)
    pack_starts: bool = False  # the lifecycle workers sent start-tasks packed (start-tasks)


def _masters(connections: Connections) -> list[redis.Redis]:
    return [redis.Redis(host=host, port=port) for host, port in connections.masters()]


def _ended(deployment: Deployment) -> tuple[int, int]:
    """(finished, failed or terminated) workflows in every partition."""
    outcomes = deployment.outcomes()
    failed = outcomes.get("failed", 0) + outcomes.get("terminated", 0)
    return outcomes.get("finished", 0), failed


def _submit(deployment: Deployment, ids: list[str]) -> None:
    """Each partition's workflows in one call to its master."""
    graph = compile_text(CHAIN10)
    for index, chosen in deployment.partitions.group(ids).items():
        keys = deployment.partitions.keys(index)
        inputs = [{"n": n} for n in range(len(chosen))]
        start_workflows(deployment.client_for(keys), graph, inputs, chosen, keys)


def run_once(url: str, args: argparse.Namespace, masters: int, logs: Path | None) -> ClusterFigures:
    # A single server works too (P partitions on one Redis: what partitions cost).
    connections = Connections.open(resolve_url(url, None))
    mode = ("--cluster",) if connections.cluster else ()
    for master in _masters(connections):
        master.flushall()
    with ExitStack() as stack:
        stack.callback(connections.close)
        procs: dict[str, list[Any]] = {"lifecycle": [], "noop": [], "receipts": []}

        def log(name: str) -> Path | None:
            return logs / f"m{masters}-{name}.log" if logs else None

        for n in range(args.lifecycle):
            command = ("lifecycle", "worker", *mode, "--partitions", str(args.partitions))
            command += ("--no-wait", "--consumer", f"lc{n}")
            if args.pack_starts:
                command += ("--pack-starts",)
            procs["lifecycle"].append(spawn(url, *command, log=log(f"lc{n}")))
        deployment = Deployment(connections, "{flow}", args.partitions)
        deadline = time.monotonic() + 30
        while True:  # the first worker stores the count the others check
            try:
                deployment.partitions  # noqa: B018 - reads and checks the stored count
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        for n in range(args.workers):
            command = ("workers", "noop", *mode, "--kinds", "default", "--consumer", f"w{n}")
            if args.pack_answers:
                command += ("--pack-answers",)
            procs["noop"].append(spawn(url, *command, log=log(f"w{n}")))
        if not args.no_receipts:
            archive = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-cluster-"))
            command = ("lifecycle", "receipts", *mode, "--archive", archive)
            procs["receipts"].append(spawn(url, *command, log=log("receipts")))
        stack.callback(stop_processes, [p for group in procs.values() for p in group])

        warm = [f"warm-{n}" for n in range(WARMUP)]
        _submit(deployment, warm)
        while sum(_ended(deployment)) < WARMUP:
            time.sleep(0.05)
        servers = _masters(connections)
        cpu_before = {p.pid: process_cpu_seconds(p.pid) for g in procs.values() for p in g}
        redis_before = [redis_cpu_seconds(server) for server in servers]
        started = time.perf_counter()
        ids = [f"w{n}" for n in range(args.workflows)]
        _submit(deployment, ids)
        last, seen, stalled = time.perf_counter(), 0, False
        while (done := sum(_ended(deployment)) - WARMUP) < args.workflows:
            time.sleep(0.05)
            if done != seen:
                last, seen = time.perf_counter(), done
            elif time.perf_counter() - last > args.stall:
                stalled = True
                break
        wall = time.perf_counter() - started
        cpu = {
            kind: round(sum(process_cpu_seconds(p.pid) - cpu_before[p.pid] for p in group), 2)
            for kind, group in procs.items()
            if group
        }
        for n, server in enumerate(servers):
            cpu[f"redis{n}"] = round(redis_cpu_seconds(server) - redis_before[n], 2)
        cpu["total"] = round(sum(cpu.values()), 2)
        finished, _ = _ended(deployment)
        finished -= WARMUP
        deployment.close()
    tasks = finished * 10
    return ClusterFigures(
        masters=masters,
        partitions=args.partitions,
        workflows=args.workflows,
        tasks=tasks,
        wall_s=round(wall, 2),
        tasks_per_s=round(tasks / wall, 1),
        finished=finished,
        stuck=0 if not stalled else args.workflows - finished,
        cpu_s=cpu,
        pack_answers=args.pack_answers,
        pack_starts=args.pack_starts,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench --cluster", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--cluster",
        nargs="?",
        const="",
        metavar="URL",
        help="a cluster node's URL (every master is flushed); none: local clusters",
    )
    parser.add_argument("--partitions", type=at_least_one, default=6, help="partitions (default 6)")
    parser.add_argument("--masters", default="1,2,3", help="local clusters' masters (1,2,3)")
    parser.add_argument("--workflows", type=at_least_one, default=10_000, help="chain10 workflows")
    parser.add_argument(
        "--lifecycle", type=at_least_one, default=2, help="lifecycle worker processes"
    )
    parser.add_argument("--workers", type=at_least_one, default=1, help="no-op worker processes")
    parser.add_argument("--no-receipts", action="store_true", help="without the receipts worker")
    add_packing_arguments(parser)
    parser.add_argument("--stall", type=float, default=30.0, help="give up after this idle")
    parser.add_argument("--logs", help="write each process's output to DIR")
    parser.add_argument("--json", help="also write the figures to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    Partitions("{flow}", args.partitions)  # a bad count: said before anything starts
    logs = Path(args.logs) if args.logs else None
    if logs:
        logs.mkdir(parents=True, exist_ok=True)
    rows: list[ClusterFigures] = []
    if args.cluster:
        rows.append(run_once(args.cluster, args, len(args.masters.split(",")), logs))
    else:
        for masters in (int(m) for m in args.masters.split(",")):
            with LocalCluster(masters=masters, replicas=0) as cluster:
                rows.append(run_once(cluster.url, args, masters, logs))
    base = next((row.tasks_per_s for row in rows if row.masters == 1), None)
    print("masters  partitions  tasks   wall_s  tasks/s  ratio  cpu_s")
    for row in rows:
        if base:
            row.ratio_to_one_master = round(row.tasks_per_s / base, 2)
        cpu = ", ".join(f"{k} {v}" for k, v in row.cpu_s.items())
        ratio = "-" if row.ratio_to_one_master is None else f"{row.ratio_to_one_master:.2f}"
        print(
            f"{row.masters:<8} {row.partitions:<11} {row.tasks:<7} {row.wall_s:<7} "
            f"{row.tasks_per_s:<8} {ratio:<6} {cpu}"
        )
        if row.stuck:
            print(f"  {row.stuck} workflows did not end (no progress for {args.stall:g} s)")
    if args.json:
        Path(args.json).write_bytes(
            orjson.dumps([asdict(row) for row in rows], option=orjson.OPT_INDENT_2)
        )
    return 0 if all(not row.stuck for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
