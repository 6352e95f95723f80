"""Soak: workflows at a steady rate with a short retention; Redis memory must come back.

``python -m bench.soak --workflows 100000 --rate 1000 --retain 60s`` starts a
private Redis, a lifecycle worker with that retention, a no-op worker and the
receipts worker (which trims the streams), submits chain10 workflows at the
rate, samples Redis memory every few seconds while they run, finish and expire,
and prints the curve and the end state against the empty baseline.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import redis

from bench.engine import KEYS, SHAPES, ended_count, spawn, stop_processes
from flowlang.compiler import compile_text
from lifecycle.engine.retention import parse_duration
from lifecycle.submit import start_workflows
from rqse.server import RedisServer

__all__ = ["main"]


def _sample(client: redis.Redis, began: float) -> dict[str, Any]:
    memory = client.info("memory")
    return {
        "t_s": round(time.perf_counter() - began, 1),
        "used_memory": int(memory["used_memory"]),
        "workflows": client.zcard(KEYS.workflows),
        "expiring": client.zcard(KEYS.expiring),
        "lifecycle_stream": client.xlen(KEYS.lifecycle),
        "task_stream": client.xlen(KEYS.tasks("default")),
        "ended": sum(ended_count(client)),
    }


def _wait_empty(client: redis.Redis, count: int, timeout: float) -> None:
    """Until ``count`` workflows have ended and none is left in Redis, or ``timeout``."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        ended = sum(ended_count(client)) >= count
        if ended and client.zcard(KEYS.workflows) == 0 and client.xlen(KEYS.lifecycle) < 100:
            return
        time.sleep(0.2)


def soak(args: argparse.Namespace) -> dict[str, Any]:
    text, _ = SHAPES[args.shape]
    graph = compile_text(text)
    retain = parse_duration(args.retain)
    curve: list[dict[str, Any]] = []
    with ExitStack() as stack:
        server = stack.enter_context(RedisServer())
        client = redis.Redis.from_url(server.url)
        archive = stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-receipts-"))
        procs = [
            spawn(server.url, "lifecycle", "worker", "--no-wait", "--retain", args.retain),
            spawn(server.url, "workers", "noop", "--kinds", "default"),
            spawn(server.url, "lifecycle", "receipts", "--archive", archive),
        ]
        stack.callback(stop_processes, procs)
        time.sleep(2.0)  # the workers create their groups and scripts
        cold = int(client.info("memory")["used_memory"])
        # The baseline is a warm system's: a first round allocates, once, what any use
        # does (the Lua VM, script caches, stream and group structures, ~0.5 MB).
        warm_ids = [f"warm{n}" for n in range(args.warmup)]
        start_workflows(client, graph, [{"n": n} for n in range(args.warmup)], warm_ids, KEYS)
        _wait_empty(client, args.warmup, retain + args.settle)
        baseline_memory = client.info("memory")
        baseline = int(baseline_memory["used_memory"])
        client.hdel(KEYS.outcomes, "finished", "failed", "terminated")
        began = time.perf_counter()
        next_sample, submitted, chunk = 0.0, 0, max(1, args.rate // 10)
        deadline = None
        while True:
            now = time.perf_counter() - began
            if submitted < args.workflows and now * args.rate >= submitted:
                count = min(chunk, args.workflows - submitted)
                ids = [f"s{n}" for n in range(submitted, submitted + count)]
                start_workflows(client, graph, [{"n": n} for n in range(count)], ids, KEYS)
                submitted += count
            if now >= next_sample:
                curve.append(_sample(client, began))
                next_sample += args.sample
                last = curve[-1]
                if args.progress:
                    print(orjson.dumps(last).decode(), flush=True)
                if submitted == args.workflows and last["ended"] >= args.workflows:
                    deadline = deadline or now + retain + args.settle
                    if (last["workflows"] == 0 and last["lifecycle_stream"] < 100) or (
                        now > deadline
                    ):
                        break
            time.sleep(0.01)
        final = _sample(client, began)
        curve.append(final)
        kept = {
            key.decode(): int(client.memory_usage(key) or 0) for key in client.scan_iter(count=1000)
        }
        memory = client.info("memory")
        finished, failed = ended_count(client)
    peak = max(sample["used_memory"] for sample in curve)
    return {
        "workflows": args.workflows,
        "rate": args.rate,
        "retain": args.retain,
        "finished": finished,
        "failed": failed,
        "cold_bytes": cold,
        "baseline_bytes": baseline,
        "baseline_dataset_bytes": int(baseline_memory["used_memory_dataset"]),
        "peak_bytes": peak,
        "final_bytes": final["used_memory"],
        "final_over_baseline": round(final["used_memory"] / baseline, 3),
        "left_workflows": final["workflows"],
        "final_dataset_bytes": int(memory["used_memory_dataset"]),
        "final_overhead_bytes": int(memory["used_memory_overhead"]),
        "memory_growth": {
            name: int(value) - int(baseline_memory[name])
            for name, value in memory.items()
            if isinstance(value, int) and abs(int(value) - int(baseline_memory[name])) > 20_000
        },
        "keys_left": dict(sorted(kept.items(), key=lambda item: -item[1])[:10]),
        "curve": curve,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--workflows", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=1000, help="workflows submitted per second")
    parser.add_argument("--retain", default="60s", help="the lifecycle worker's --retain")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="chain10")
    parser.add_argument(
        "--warmup", type=int, default=1000, help="workflows run and expired before the baseline"
    )
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument(
        "--settle", type=float, default=30.0, help="seconds past the retention to wait at most"
    )
    parser.add_argument("--progress", action="store_true", help="print each sample as it is taken")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    result = soak(args)
    print(f"{'t_s':>7} {'used_memory':>12} {'workflows':>10} {'expiring':>9} {'lifecycle':>10}")
    for sample in result["curve"]:
        print(
            f"{sample['t_s']:>7} {sample['used_memory']:>12,} {sample['workflows']:>10,} "
            f"{sample['expiring']:>9,} {sample['lifecycle_stream']:>10,}"
        )
    for key, value in result.items():
        if key != "curve":
            print(f"{key:<22}{value}")
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0 if result["left_workflows"] == 0 and result["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
