"""CPU per event of each engine component, measured one at a time.

``python -m bench.phases --workflows 5000`` submits chain10 workflows, then
runs the components in turn in this process until each has drained its input:
the lifecycle worker (start-workflow, then each round of end-tasks), the no-op
worker (each round of start-tasks), and the receipts worker (everything, at
the end). Each phase's CPU (this process) and the server's CPU (INFO cpu) are
divided by the events it handled. Nothing runs concurrently, so the figures
are repeatable where the whole-system benchmark (``python -m bench``) is at
the mercy of two busy cores; compare them as ratios between two commits.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from functools import reduce
from typing import Any

import redis

from bench.engine import SHAPES, redis_cpu_seconds
from flowlang.compiler import compile_text
from lifecycle.audit.receipts import ReceiptsWorker
from lifecycle.audit.segments import SegmentSink
from lifecycle.keys import DEFAULT_KIND, Keys
from lifecycle.kind_limits import set_kind_limit
from lifecycle.submit import start_workflows
from lifecycle.worker import LifecycleWorker
from rqse.process import settle_process
from rqse.server import ALLOCATORS, RedisServer
from workers.noop import NoopWorker

KEYS = Keys()


def _drain(client: redis.Redis, listener: Any, idle: float) -> int:
    """Handle what the listener's streams hold for its group now: the group's lag, or
    until ``idle`` seconds bring nothing (a phase ends without waiting when it knows)."""
    queued = 0
    for stream in listener.streams:
        groups = client.xinfo_groups(stream) if client.exists(stream) else []
        lags = [g["lag"] for g in groups if g["name"].decode() == listener.group]
        # No group yet: the listener creates it at id 0 and reads the whole stream. A lag
        # Redis does not know (None) is taken as the whole stream too: the idle timeout
        # then ends the phase.
        queued += int(lags[0]) if lags and lags[0] is not None else int(client.xlen(stream))
    if not queued:
        return 0
    before = listener.stats.handled
    for _ in range(3):
        # A listener's first call establishes (groups, checks) before it reads: on a busy
        # machine that alone can outlast ``idle`` and end the call with nothing read.
        listener.listen(max_events=queued, idle_timeout=idle)
        if listener.stats.handled != before:
            break
    return int(listener.stats.handled - before)


def run(
    workflows: int,
    shape: str,
    server_path: str | None,
    allocator: str = "builtin",
    idle: float = 0.05,
    commands: dict[str, dict[str, list[int]]] | None = None,
    max_running: int | None = None,
    mark_lifecycle: bool = False,
    kind_limit: int | None = None,
) -> dict[str, dict[str, float]]:
    """``idle``: how long a phase waits for more input before it counts as drained
    (longer under valgrind, where start-up alone takes longer than the default).
    ``mark_lifecycle``: each lifecycle phase runs inside ``functools.reduce``, a call
    nothing else makes, so that ``valgrind --tool=callgrind
    --toggle-collect=functools_reduce`` counts the lifecycle's instructions alone.
    ``commands``, when given, gathers each phase's Redis commands: name -> [calls,
    usec] (INFO commandstats; the INFO calls themselves included). ``kind_limit``: the
    tasks' kind limited to that many at once (the no-op worker takes and releases slots)."""
    text, _ = SHAPES[shape]
    graph = compile_text(text)
    cpu: dict[str, float] = defaultdict(float)
    server_cpu: dict[str, float] = defaultdict(float)
    events: dict[str, int] = defaultdict(int)
    with (
        RedisServer(server_path, allocator=allocator) as server,
        tempfile.TemporaryDirectory() as archive,
    ):
        client = redis.Redis.from_url(server.url)
        if kind_limit is not None:
            set_kind_limit(client, KEYS, DEFAULT_KIND, kind_limit)
        lifecycle = LifecycleWorker(
            KEYS, timers=False, consumer="lc", pool=client.connection_pool, handle_signals=False
        )
        noop = NoopWorker(
            ["default"], KEYS, consumer="w", pool=client.connection_pool, handle_signals=False
        )
        sink = SegmentSink(archive)
        receipts = ReceiptsWorker(client, sink, KEYS, trim_every=None)
        receipts._discover()  # joins its groups now, so that it sees every entry
        inputs = [{"n": i} for i in range(workflows)]
        keyed: dict[str, Any] = {}
        if max_running is not None:  # every workflow under one concurrency key
            keyed = {"concurrency_key": "bench", "max_running": max_running}
        start_workflows(client, graph, inputs, [f"w{i}" for i in range(workflows)], KEYS, **keyed)
        settle_process()

        def phase(name: str, step: Any) -> int:
            before = _commandstats(client) if commands is not None else {}
            s0, c0 = redis_cpu_seconds(client), time.process_time()
            handled = step()
            cpu[name] += time.process_time() - c0
            server_cpu[name] += redis_cpu_seconds(client) - s0
            events[name] += handled
            if commands is not None:
                for command, (calls, usec) in _commandstats(client).items():
                    was = before.get(command, (0, 0))
                    kept = commands[name].setdefault(command, [0, 0])
                    kept[0] += calls - was[0]
                    kept[1] += usec - was[1]
            return int(handled)

        def drain_lifecycle() -> int:
            if mark_lifecycle:
                return int(reduce(lambda _, __: _drain(client, lifecycle, idle), [0, 0]))
            return _drain(client, lifecycle, idle)

        while phase("lifecycle", drain_lifecycle):
            if not phase("noop", lambda: _drain(client, noop, idle)):
                break

        def archive_all() -> int:
            before = receipts.stats.archived
            receipts.run(idle_timeout=idle)
            return receipts.stats.archived - before

        phase("receipts", archive_all)
        sink.close()
    return {
        name: {
            "events": events[name],
            "us_per_event": round(cpu[name] / max(events[name], 1) * 1e6, 2),
            "server_us_per_event": round(server_cpu[name] / max(events[name], 1) * 1e6, 2),
            # per workflow: what compares runs whose workflows cost different event counts
            "us_per_workflow": round(cpu[name] / workflows * 1e6, 1),
            "server_us_per_workflow": round(server_cpu[name] / workflows * 1e6, 1),
        }
        for name in ("lifecycle", "noop", "receipts")
    }


def _commandstats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    return {
        name.removeprefix("cmdstat_"): (int(stats["calls"]), int(stats["usec"]))
        for name, stats in client.info("commandstats").items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.phases", description=__doc__)
    parser.add_argument("--workflows", type=int, default=5000)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="chain10")
    parser.add_argument("--server", help="Redis/Valkey server binary")
    parser.add_argument("--allocator", choices=ALLOCATORS, default="builtin")
    parser.add_argument(
        "--idle", type=float, default=0.05, help="seconds without input that end a phase"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs; each figure is the smallest of them"
    )
    parser.add_argument(
        "--commands",
        action="store_true",
        help="also print each phase's Redis commands per event: calls and server µs "
        "(INFO commandstats; of the last run)",
    )
    parser.add_argument(
        "--max-running",
        type=int,
        metavar="N",
        help="every workflow under one concurrency key with at most N running (N at least "
        "--workflows: none waits)",
    )
    parser.add_argument(
        "--kind-limit",
        type=int,
        metavar="N",
        help="the tasks' kind limited to N at once (lifecycle limit set): the slots' cost",
    )
    parser.add_argument(
        "--mark-lifecycle",
        action="store_true",
        help="run each lifecycle phase inside functools.reduce, for "
        "valgrind --tool=callgrind --toggle-collect=functools_reduce to count it alone",
    )
    args = parser.parse_args(argv)
    best: dict[str, dict[str, float]] = {}
    commands: dict[str, dict[str, list[int]]] | None = None
    for _ in range(args.repeat):
        commands = defaultdict(dict) if args.commands else None
        for name, figures in run(
            args.workflows,
            args.shape,
            args.server,
            args.allocator,
            args.idle,
            commands,
            args.max_running,
            args.mark_lifecycle,
            args.kind_limit,
        ).items():
            kept = best.setdefault(name, figures)
            for key, value in figures.items():
                kept[key] = min(kept[key], value)
    for name, figures in best.items():
        print(f"{name:<10} " + "  ".join(f"{k} {v}" for k, v in figures.items()))
        if commands is not None:
            handled = max(int(figures["events"]), 1)
            ranked = sorted(commands[name].items(), key=lambda item: -item[1][1])
            print(
                f"{'':<10} per event: "
                + ", ".join(
                    f"{command} {calls / handled:.3f} calls {usec / handled:.2f} µs"
                    for command, (calls, usec) in ranked
                    if command != "info" and (calls / handled >= 0.001 or usec / handled >= 0.01)
                )
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
