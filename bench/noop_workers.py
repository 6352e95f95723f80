"""Task workers alone: how fast do they answer start-tasks? (No lifecycle worker.)

``python -m bench.noop_workers --tasks 50000`` starts a private Redis, writes
that many start-task events to ``{flow}:tasks:default``, starts the worker
processes and times until every end-task is on ``{flow}:lifecycle``. Three
setups: ``python -m workers noop`` (batches of 200, one process, then two),
and a ``workers.TaskListener`` through ``python -m workers run`` (one task per
batch, ``--concurrency`` threads) to show what the contract's defaults cost.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

import redis

from lifecycle.events import START_TASK
from lifecycle.keys import TASK_GROUP, Keys
from rqse.events import encode_event
from rqse.server import RedisServer
from workers import Task, TaskListener

KEYS = Keys()


class Echo(TaskListener):
    """The no-op as a TaskListener: output = input."""

    kind = "default"

    def run(self, task: Task) -> Any:
        return task.input


def _fill(client: redis.Redis, tasks: int) -> None:
    stream = KEYS.tasks("default")
    client.delete(stream, KEYS.lifecycle)
    client.xgroup_create(stream, TASK_GROUP, id="0", mkstream=True)
    pipe = client.pipeline(transaction=False)
    for n in range(tasks):
        event = {
            "kind": START_TASK,
            "workflow": f"w{n}",
            "name": "A",
            "index": 1,
            "key": "1",
            "attempt": 1,
            "id": f"w{n}/1/1",
            "input": {"n": n},
            "parameters": {},
        }
        pipe.xadd(stream, encode_event(event))
        if n % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def _time(url: str, client: redis.Redis, tasks: int, commands: list[list[str]]) -> float:
    _fill(client, tasks)
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "workers", *command, "--redis-url", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for command in commands
    ]
    try:
        while client.xlen(KEYS.lifecycle) < tasks:
            time.sleep(0.01)
        return time.perf_counter() - started
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.noop_workers", description=__doc__)
    parser.add_argument("--tasks", type=int, default=50_000)
    args = parser.parse_args(argv)
    noop = ["noop", "--kinds", "default"]
    echo = ["run", "bench.noop_workers:Echo"]
    setups = {
        "workers noop, 1 process": [noop],
        "workers noop, 2 processes": [noop, noop],
        "workers run Echo (TaskListener), --concurrency 4": [[*echo, "--concurrency", "4"]],
    }
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        print(f"{args.tasks} start-tasks, private Redis, process start-up included")
        for name, commands in setups.items():
            tasks = args.tasks if "noop" in name else args.tasks // 5
            seconds = _time(server.url, client, tasks, commands)
            print(f"{name:52} {tasks:7d} tasks {seconds:6.2f} s {tasks / seconds:9.0f} tasks/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
