"""Receipts worker throughput: how fast the archive fills, and whether it keeps up.

``python -m bench.receipts_throughput filled --events 100000``
    fill the lifecycle and a task stream with realistic engine events, then time
    one receipts worker (in this process) archiving all of them: events/s, the
    worker's and the server's CPU per event (and so the events per CPU-second of
    the two: what one core archives), bytes per event, fsync per batch included.
``python -m bench.receipts_throughput backlog --sizes 1000000 3000000 --target 10000000``
    fill the streams with each size in turn and time one worker catching up with
    the backlog; the target's catch-up time is measured, or extrapolated from the
    largest size (labelled so) when it does not fit here.
``python -m bench.receipts_throughput engine --workflows 10000 --shape chain10``
    the engine benchmark's setup (private Redis, one lifecycle and one no-op
    worker process) plus a receipts worker process that trims: time until every
    workflow ended, then until the archive caught up (the lag), and the peak
    stream lengths sampled every 50 ms.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import redis

from bench.engine import SHAPES, redis_cpu_seconds, spawn, stop_processes
from flowlang.compiler import compile_text
from lifecycle.audit.receipts import ReceiptsWorker
from lifecycle.audit.segments import SegmentSink
from lifecycle.events import END_TASK, START_TASK
from lifecycle.keys import LIFECYCLE_GROUP, RECEIPTS_GROUP, Keys
from lifecycle.submit import start_workflows
from rqse.fastpipe import SLOT, Command, Template, execute
from rqse.process import settle_process
from rqse.server import RedisServer

KEYS = Keys()


def _templates() -> tuple[Template, Template]:
    """XADDs of a start-task and its end-task, their varying values as slots: the
    events of the chain10 benchmark, their values as orjson writes them."""
    tasks = KEYS.tasks("default")
    start = Template(
        "XADD", tasks, "*", "kind", orjson.dumps(START_TASK), "workflow", SLOT, "name", SLOT,
        "index", SLOT, "key", SLOT, "attempt", b"1", "id", SLOT, "input", SLOT,
        "parameters", b"{}",
    )  # fmt: skip
    end = Template(
        "XADD", KEYS.lifecycle, "*", "kind", orjson.dumps(END_TASK), "workflow", SLOT,
        "key", SLOT, "attempt", b"1", "status", b'"SUCCESS"', "output", SLOT,
        "worker", b'"noop-host-1234-abcdef"',
    )  # fmt: skip
    return start, end


def _fill(client: redis.Redis, events: int) -> None:
    """Half start-task, half end-task events shaped like the chain10 benchmark's,
    formatted from templates (a 10M-event backlog fills in about a minute)."""
    client.sadd(KEYS.kinds, "default")
    start, end = _templates()
    commands: list[Command] = []
    for n in range(events // 2):
        workflow, key = b'"w%d"' % (n // 10), n % 10 + 1
        output = b'{"n":%d}' % (n // 10)
        task_id = b'"w%d/%d/1"' % (n // 10, key)
        commands.append(
            start.fill(workflow, b'"A%d"' % key, b"%d" % key, b'"%d"' % key, task_id, output)
        )
        commands.append(end.fill(workflow, b'"%d"' % key, output))
        if len(commands) >= 10_000:
            _send(client, commands)
    _send(client, commands)


def _send(client: redis.Redis, commands: list[Command]) -> None:
    for reply in execute(client, commands):
        if isinstance(reply, BaseException):
            raise reply
    commands.clear()


def filled(args: argparse.Namespace, events: int | None = None) -> dict[str, Any]:
    events = args.events if events is None else events
    with RedisServer() as server, tempfile.TemporaryDirectory() as directory:
        client = redis.Redis.from_url(server.url)
        fill_began = time.perf_counter()
        _fill(client, events)
        fill_s = time.perf_counter() - fill_began
        sink = SegmentSink(
            directory, segment_bytes=int(args.segment_mb * (1 << 20)), compress=args.compress
        )
        worker = ReceiptsWorker(
            client, sink, KEYS, batch_size=args.batch_size, block_ms=50, trim_every=None
        )
        if not args.no_settle:
            settle_process()  # as `python -m lifecycle receipts` does
        server_began = redis_cpu_seconds(client)
        began, cpu_began = time.perf_counter(), time.process_time()
        stats = worker.run(idle_timeout=0.2)
        elapsed = time.perf_counter() - began - 0.2  # the idle wait at the end is not work
        cpu = time.process_time() - cpu_began  # this process only: Redis is another one
        server_cpu = redis_cpu_seconds(client) - server_began
        sink.close()
        size = sum(p.stat().st_size for p in Path(directory).glob("segment-*"))
        archived = stats.archived
        return {
            "events": archived,
            "fill_s": round(fill_s, 1),
            "seconds": round(elapsed, 2),
            "events_per_s": round(archived / elapsed),
            "worker_cpu_us_per_event": round(cpu / archived * 1e6, 2),
            "redis_cpu_us_per_event": round(server_cpu / archived * 1e6, 2),
            # Worker and server on one core: what they would archive, by their CPU time.
            "events_per_cpu_s": round(archived / (cpu + server_cpu)),
            "bytes_per_event": round(sink.bytes_written / archived, 1),
            "bytes_per_event_on_disk": round(size / archived, 1),
            "fsyncs": stats.batches,
        }


def backlog(args: argparse.Namespace) -> dict[str, Any]:
    """Each size in turn: fill the streams, then time one worker archiving the backlog.
    Sizes below ``--target`` give the target's catch-up time by extrapolation (seconds
    per event at the largest size measured), labelled as such."""
    runs = [filled(args, events) for events in args.sizes]
    largest = max(runs, key=lambda run: run["events"])
    result: dict[str, Any] = {"runs": runs}
    for run in runs:
        run["us_per_event"] = round(run["seconds"] / run["events"] * 1e6, 2)
    measured = next((run for run in runs if run["events"] >= args.target), None)
    if measured is not None:
        result[f"catch_up_{args.target}_s"] = measured["seconds"]
    else:
        seconds = largest["seconds"] / largest["events"] * args.target
        result[f"catch_up_{args.target}_s_extrapolated"] = round(seconds, 1)
        result["extrapolated_from"] = largest["events"]
    return result


def _caught_up(client: redis.Redis, streams: list[str]) -> bool:
    for stream in streams:
        last = client.xinfo_stream(stream)["last-generated-id"]
        groups = {g["name"].decode(): g for g in client.xinfo_groups(stream)}
        group = groups.get(RECEIPTS_GROUP)
        if group is None or group["pending"] or group["last-delivered-id"] != last:
            return False
    return True


def engine(args: argparse.Namespace) -> dict[str, Any]:
    text, per_workflow = SHAPES[args.shape]
    graph = compile_text(text)
    streams = [KEYS.lifecycle, KEYS.tasks("default")]
    with ExitStack() as stack:
        server = stack.enter_context(RedisServer())
        directory = stack.enter_context(tempfile.TemporaryDirectory())
        client = redis.Redis.from_url(server.url)
        procs = [
            spawn(server.url, "lifecycle", "worker", "--consumer", "lc0"),
            spawn(server.url, "workers", "noop", "--kinds", "default", "--consumer", "w0"),
        ]
        if not args.no_receipts:
            procs.append(spawn(server.url, "lifecycle", "receipts", "--archive", directory))
        stack.callback(stop_processes, procs)
        time.sleep(1.0)
        began = time.perf_counter()
        ids = [f"w{i}" for i in range(args.workflows)]
        start_workflows(client, graph, [{"n": i} for i in range(args.workflows)], ids, KEYS)
        peaks = dict.fromkeys(streams, 0)
        ended_at = None
        while True:
            for stream in streams:
                peaks[stream] = max(peaks[stream], int(client.xlen(stream)))
            if ended_at is None:
                ends = client.xinfo_groups(KEYS.lifecycle)
                lag = {g["name"].decode(): g for g in ends}.get(LIFECYCLE_GROUP)
                done = client.zcard(KEYS.workflows) == args.workflows and lag and not lag["lag"]
                if done and _all_ended(client, ids):
                    ended_at = time.perf_counter()
            if ended_at is not None and (args.no_receipts or _caught_up(client, streams)):
                break
            if time.perf_counter() - began > args.timeout:
                raise SystemExit("timed out")
            time.sleep(0.05)
        caught_up = time.perf_counter()
        archived = sum(client.xinfo_stream(s)["entries-added"] for s in streams)
    wall = ended_at - began
    return {
        "shape": args.shape,
        "workflows": args.workflows,
        "receipts": not args.no_receipts,
        "engine_wall_s": round(wall, 2),
        "tasks_per_s": round(args.workflows * per_workflow / wall),
        "events_written": archived,
        "engine_events_per_s": round(archived / wall),
        "archive_lag_after_end_s": round(caught_up - ended_at, 2),
        "peak_stream_lengths": peaks,
    }


def _all_ended(client: redis.Redis, ids: list[str]) -> bool:
    pipe = client.pipeline(transaction=False)
    for workflow in ids:
        pipe.hget(KEYS.workflow(workflow), "ended")
    return all(pipe.execute())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.receipts_throughput")
    parser.add_argument("mode", choices=["filled", "backlog", "engine"])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1_000_000, 3_000_000], help="backlog sizes"
    )
    parser.add_argument("--target", type=int, default=10_000_000, help="backlog to catch up")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument(
        "--no-settle", action="store_true", help="keep the default GC and heap settings"
    )
    parser.add_argument("--compress", action="store_true")
    parser.add_argument("--segment-mb", type=float, default=64.0)
    parser.add_argument("--workflows", type=int, default=10_000)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="chain10")
    parser.add_argument("--no-receipts", action="store_true", help="engine alone, to compare")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    modes = {"filled": filled, "backlog": backlog, "engine": engine}
    result = modes[args.mode](args)
    sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
