"""Priorities at a task worker: how long a high-priority task waits behind a backlog,
and how lower priorities fare while higher ones keep coming.

``python -m bench.priorities`` starts a private Redis and, in this process, one
``workers.TaskListener`` of kind ``default`` (each task sleeps ``--work-us``):

* arrival: ``--backlog`` priority-0 start-tasks wait; once the worker has run a
  tenth of them, one start-task of priority 5 is added. Printed: how many
  priority-0 tasks started between its XADD's reply and its start (at most the
  batch in hand: the next read brings it, and it runs first), how long it waited,
  and how many reads the worker made meanwhile;
* no starvation: ``--backlog`` priority-0 and as many priority-5 start-tasks wait;
  of the first ``--backlog`` / 5 tasks run, the share of each priority.

Start-tasks are written directly (as ``bench.noop_workers`` does): this measures the
worker's side, the engine's routing is the same XADD to another stream.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import redis

from bench.noop_workers import start_task_commands
from lifecycle.keys import Keys
from lifecycle.priorities import priority_member, stream_priority
from rqse.fastpipe import execute
from rqse.server import RedisServer
from workers import Task, TaskListener

KEYS = Keys()
HIGH = 5


class Timed(TaskListener):
    """Notes when each task starts and its stream's priority; sleeps ``work_us``."""

    kind = "default"

    def __init__(self, work_us: float, **options: Any) -> None:
        super().__init__(handle_signals=False, block_ms=100, **options)
        self.work_s = work_us / 1e6
        self.started: list[tuple[float, int]] = []
        self.reads = 0

    def prepare_batch(self, stream: str, entries: Any) -> Any:
        if stream == self.streams[0] or len(self.streams) == 1:
            self.reads += 1  # one call per stream of a read; counted on the first stream
        return super().prepare_batch(stream, entries)

    def run(self, task: Task) -> Any:
        priority = stream_priority(KEYS, str(self.current_stream))
        self.started.append((time.perf_counter(), priority if priority is not None else 0))
        if self.work_s:
            time.sleep(self.work_s)
        return {}


def _fill(client: redis.Redis, commands: list[Any]) -> None:
    for first in range(0, len(commands), 2000):
        execute(client, commands[first : first + 2000])


def _fresh(client: redis.Redis) -> None:
    client.flushdb()
    client.sadd(KEYS.kinds, "default")
    # Registered before the worker starts: a priority stream that appears later is
    # found within the worker's discovery period (workers.task.PRIORITY_DISCOVERY).
    client.sadd(KEYS.priorities, priority_member("default", HIGH))


def _run_until(worker: Timed, done: Any, timeout: float = 120) -> threading.Thread:
    thread = threading.Thread(target=worker.listen, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.001)
    return thread


def arrival(url: str, client: redis.Redis, backlog: int, batch: int, work_us: float) -> str:
    _fresh(client)
    _fill(client, start_task_commands(backlog, 0))
    pool = redis.ConnectionPool.from_url(url)
    worker = Timed(work_us, pool=pool, batch_size=batch)
    thread = _run_until(worker, lambda: len(worker.started) >= backlog // 10)
    reads_before = worker.reads
    _fill(client, start_task_commands(1, HIGH, first=backlog))
    # From its XADD's reply: Redis holds it, so every read from then on brings it.
    sent = time.perf_counter()
    deadline = time.monotonic() + 60
    while not any(p == HIGH for _, p in worker.started) and time.monotonic() < deadline:
        time.sleep(0.0005)
    worker.stop()
    thread.join(timeout=10)
    pool.disconnect()
    at = next(t for t, p in worker.started if p == HIGH)
    overtaken = sum(1 for t, p in worker.started if p == 0 and sent <= t < at)
    return (
        f"arrival      backlog {backlog} batch {batch:3d}: priority-{HIGH} task started after "
        f"{(at - sent) * 1000:7.2f} ms, {overtaken:3d} priority-0 tasks started meanwhile, "
        f"{worker.reads - reads_before} reads"
    )


def starvation(url: str, client: redis.Redis, backlog: int, batch: int, work_us: float) -> str:
    _fresh(client)
    _fill(client, start_task_commands(backlog, 0))
    _fill(client, start_task_commands(backlog, HIGH, first=backlog))
    pool = redis.ConnectionPool.from_url(url)
    worker = Timed(work_us, pool=pool, batch_size=batch)
    window = backlog // 5
    thread = _run_until(worker, lambda: len(worker.started) >= window)
    worker.stop()
    thread.join(timeout=10)
    pool.disconnect()
    first = worker.started[:window]
    low = sum(1 for _, p in first if p == 0)
    return (
        f"no starving  backlog {backlog}+{backlog} batch {batch:3d}: of the first {window} "
        f"tasks, {window - low} priority {HIGH} and {low} priority 0 ({low / window:.0%})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.priorities", description=__doc__)
    parser.add_argument("--backlog", type=int, default=10_000, help="default 10000")
    parser.add_argument("--work-us", type=float, default=100.0, help="each task's sleep")
    parser.add_argument(
        "--batch", type=int, nargs="+", default=[1, 50], help="worker batch sizes to run"
    )
    args = parser.parse_args(argv)
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        print(f"one TaskListener of kind default, tasks of {args.work_us:g} µs, private Redis")
        for batch in args.batch:
            print(arrival(server.url, client, args.backlog, batch, args.work_us))
        for batch in args.batch:
            print(starvation(server.url, client, args.backlog, batch, args.work_us))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
