"""The engine benchmark: W workflows through N lifecycle workers and M no-op workers.

``python -m bench --workflows 10000 --shape chain10`` starts a private Redis
(the server the tests use), the workers as separate processes, submits every
workflow as fast as it can, waits until all have ended, and prints one table.
``python -m bench latency`` measures submit→finished of single-task workflows
one at a time on an idle system.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis

from flowlang.compiler import compile_text
from lifecycle.events import END_WORKFLOW
from lifecycle.keys import Keys
from lifecycle.submit import start_workflow, start_workflows
from rqse.server import PERSISTENCE_OPTIONS, RedisServer

__all__ = ["KEYS", "SHAPES", "ended_count", "main", "spawn", "stop_processes"]

SHAPES = {
    "chain10": ("→".join(f"A{i}" for i in range(1, 11)), 10),
    "fan": ("A → { B C D E } → F", 6),
    "single": ("A", 1),
    # map10: one task whose output is 10 items (the no-op echoes the list input), then * B, then C.
    "map10": ("A → * B → C", 12),
}
MAP_INPUT = [{"item": i} for i in range(10)]
KEYS = Keys()
_END_WORKFLOW_JSON = orjson.dumps(END_WORKFLOW)


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
    peak_stream_length: dict[str, int] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    redis_us_per_task: dict[str, float] = field(default_factory=dict)  # by command
    redis_calls_per_task: dict[str, float] = field(default_factory=dict)


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a live process, from /proc (Linux); 0 elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def redis_cpu_seconds(client: redis.Redis) -> float:
    """The server's user + system CPU so far (INFO cpu)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"] + info["used_cpu_sys"])


def _server_name(client: redis.Redis, server: RedisServer) -> str:
    """E.g. ``valkey 8.1.8 (libc, mimalloc preloaded)``: figures depend on the server and
    its allocator (a preloaded one replaces malloc unbeknown to the server's INFO)."""
    info = client.info("server")
    name = info.get("server_name") or "redis"
    version = info.get("valkey_version") or info.get("redis_version")
    allocator = client.info("memory").get("mem_allocator", "?")
    if server.preloaded:
        allocator += f", {Path(server.preloaded).stem.removeprefix('lib')} preloaded"
    return f"{name} {version} ({allocator})"


def spawn(url: str, *command: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    """A worker process; its output goes to ``log`` (appended) or nowhere."""
    output = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - the child's
    try:
        return subprocess.Popen(
            [sys.executable, "-m", *command, "--redis-url", url],
            stdout=output,
            stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
        )
    finally:
        if log:
            output.close()


def stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def ended_count(client: redis.Redis) -> tuple[int, int]:
    """(finished, failed or terminated) workflows, from the engine's outcome counters."""
    finished, failed, terminated = client.hmget(KEYS.outcomes, "finished", "failed", "terminated")
    return int(finished or 0), int(failed or 0) + int(terminated or 0)


def _events_added(client: redis.Redis) -> int:
    """Entries ever added to the lifecycle stream: any step of any workflow adds one."""
    return int(client.xinfo_stream(KEYS.lifecycle)["entries-added"])


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


def throughput(args: argparse.Namespace) -> Figures:
    text, tasks_per_workflow = SHAPES[args.shape]
    graph = compile_text(text)
    inputs = [MAP_INPUT if args.shape == "map10" else {"n": i} for i in range(args.workflows)]
    with ExitStack() as stack:
        server = stack.enter_context(
            RedisServer(args.server, persistence=args.persistence, allocator=args.allocator)
        )
        client = redis.Redis.from_url(server.url)
        logs = Path(args.logs) if args.logs else None
        if logs:
            logs.mkdir(parents=True, exist_ok=True)

        def log(name: str) -> Path | None:
            return logs / f"{name}.log" if logs else None

        procs: dict[str, list[subprocess.Popen[bytes]]] = {"lifecycle": [], "noop": []}
        for n in range(args.lifecycle):
            command = ("lifecycle", "worker", "--no-wait", "--consumer", f"lc{n}")
            procs["lifecycle"].append(spawn(server.url, *command, log=log(f"lc{n}")))
        for n in range(args.workers):
            command = ("workers", "noop", "--kinds", "default", "--consumer", f"w{n}")
            procs["noop"].append(spawn(server.url, *command, log=log(f"w{n}")))
        if not args.no_receipts:
            archive = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-receipts-"))
            command = ("lifecycle", "receipts", "--archive", archive)
            procs["receipts"] = [spawn(server.url, *command, log=log("receipts"))]
        stack.callback(stop_processes, [p for group in procs.values() for p in group])
        time.sleep(1.0)  # let the workers create their groups
        client.config_resetstat()
        # CPU from here on: the workers' start-up (imports, connecting) is not the run's.
        cpu_before = {p.pid: _cpu_seconds(p.pid) for group in procs.values() for p in group}
        redis_before = redis_cpu_seconds(client)
        started, bench_cpu = time.perf_counter(), time.process_time()
        start_workflows(client, graph, inputs, [f"w{i}" for i in range(args.workflows)], KEYS)
        submitted = time.perf_counter() - started
        peaks = {"lifecycle": 0, "tasks": 0}
        last_change, added = time.perf_counter(), 0
        while sum(ended_count(client)) < args.workflows:
            time.sleep(0.05)
            # Progress is any new lifecycle event: with many workflows in flight at once,
            # none may finish for a long while although tasks end all the time.
            if (now_added := _events_added(client)) != added:
                last_change, added = time.perf_counter(), now_added
            elif time.perf_counter() - last_change > args.stall:
                break
            peaks["lifecycle"] = max(peaks["lifecycle"], client.xlen(KEYS.lifecycle))
            peaks["tasks"] = max(peaks["tasks"], client.xlen(KEYS.tasks("default")))
        wall = time.perf_counter() - started
        cpu = {
            kind: round(sum(_cpu_seconds(p.pid) - cpu_before[p.pid] for p in group), 2)
            for kind, group in procs.items()
        }
        cpu["redis"] = round(redis_cpu_seconds(client) - redis_before, 2)
        cpu["bench"] = round(time.process_time() - bench_cpu, 2)
        cpu["total"] = round(sum(cpu.values()), 2)
        server_name = _server_name(client, server)
        commandstats = client.info("commandstats")
        commands = sum(v["calls"] for v in commandstats.values())
        peak = int(client.info("memory")["used_memory_peak"])
        finished, failed = ended_count(client)
    tasks = finished * tasks_per_workflow
    return Figures(
        shape=args.shape,
        server=server_name,
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
        peak_stream_length=peaks,
        stuck=args.workflows - finished - failed,
        cpu_s=cpu,
        redis_us_per_task=_per_task(commandstats, tasks, "usec", 0.05),
        redis_calls_per_task=_per_task(commandstats, tasks, "calls", 0.001),
    )


def latency(args: argparse.Namespace) -> dict[str, Any]:
    graph = compile_text("A")
    with ExitStack() as stack:
        server = stack.enter_context(RedisServer(args.server, allocator=args.allocator))
        client = redis.Redis.from_url(server.url)
        procs = [
            spawn(server.url, "lifecycle", "worker"),
            spawn(server.url, "workers", "noop", "--kinds", "default"),
        ]
        stack.callback(stop_processes, procs)
        time.sleep(1.0)
        samples = []
        cursor = "$"
        for i in range(args.count):
            began = time.perf_counter()
            start_workflow(client, graph, {"i": i}, f"l{i}", KEYS)
            while True:
                reply = client.xread({KEYS.lifecycle: cursor}, block=1000, count=100)
                done = False
                for _, entries in reply or []:
                    for entry_id, fields in entries:
                        cursor = entry_id.decode()
                        if fields.get(b"kind") == _END_WORKFLOW_JSON:
                            done = True
                if done:
                    break
            samples.append((time.perf_counter() - began) * 1000)
    samples.sort()
    return {
        "count": len(samples),
        "p50_ms": round(statistics.median(samples), 2),
        "p99_ms": round(samples[int(len(samples) * 0.99) - 1], 2),
        "max_ms": round(samples[-1], 2),
    }


def _print_table(figures: Figures) -> None:
    rows = asdict(figures)
    width = max(len(k) for k in rows) + 2
    for key, value in rows.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        print(f"{key:<{width}}{value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="throughput", choices=["throughput", "latency"])
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="chain10")
    parser.add_argument("--lifecycle", type=int, default=1, help="lifecycle worker processes")
    parser.add_argument("--workers", type=int, default=1, help="no-op worker processes")
    parser.add_argument("--persistence", choices=sorted(PERSISTENCE_OPTIONS), default="none")
    parser.add_argument("--count", type=int, default=500, help="latency: workflows to time")
    parser.add_argument(
        "--stall", type=float, default=30.0, help="give up after this long without progress"
    )
    parser.add_argument(
        "--server", help="Redis/Valkey server binary (default: the one the tests use)"
    )
    parser.add_argument(
        "--allocator",
        choices=["auto", "builtin"],
        default="auto",
        help="auto: mimalloc preloaded into a wheel's server when installed (rqse.server)",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--logs", help="write each worker process's output to DIR/<name>.log")
    parser.add_argument(
        "--no-receipts", action="store_true", help="run without the receipts worker (its share)"
    )
    args = parser.parse_args(argv)
    if args.mode == "latency":
        result = latency(args)
        for key, value in result.items():
            print(f"{key:<10}{value}")
    else:
        figures = throughput(args)
        _print_table(figures)
        result = asdict(figures)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0
