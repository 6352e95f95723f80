"""Task workers alone: how fast do they answer start-tasks? (No lifecycle worker.)

``python -m bench.noop_workers --tasks 50000`` starts a private Redis and the
worker processes, waits until they listen, writes that many start-task events
to ``{flow}:tasks:default`` and times until every end-task is on
``{flow}:lifecycle``. Three setups: ``python -m workers noop`` (batches of 200,
one process, then two), and a ``workers.TaskListener`` through ``python -m
workers run`` (one task per batch, ``--concurrency`` threads) to show what the
contract's defaults cost. Besides the wall time, per task: the workers' CPU
(their start-up left out), the server's CPU (the writing of the start-tasks
included) and the workers' Redis commands (INFO commandstats, without the
start-tasks' XADDs and this script's polling).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

import redis
from hiredis import pack_command

from bench.engine import _cpu_seconds, redis_cpu_seconds
from lifecycle.events import START_TASK
from lifecycle.keys import TASK_GROUP, Keys
from lifecycle.kind_limits import remove_kind_limit, set_kind_limit
from rqse.events import encode_event
from rqse.fastpipe import execute
from rqse.server import RedisServer
from workers import Task, TaskListener

KEYS = Keys()


class Echo(TaskListener):
    """The no-op as a TaskListener: output = input."""

    kind = "default"

    def run(self, task: Task) -> Any:
        return task.input


def start_task_commands(count: int, priority: int = 0, first: int = 0) -> list[Any]:
    """XADDs of ``count`` start-tasks of kind ``default`` at ``priority``, packed."""
    stream = KEYS.tasks("default", priority)
    commands = []
    for n in range(first, first + count):
        event = {
            "kind": START_TASK,
            "workflow": f"w{n}",
            "name": "A",
            "index": 1,
            "key": "1",
            "attempt": 1,
            "id": f"w{n}/1/1",
            "token": f"{n:016x}",
            "input": {"n": n},
            "parameters": {},
        }
        if priority:
            event["priority"] = priority
        fields = [part for field in encode_event(event).items() for part in field]
        commands.append(pack_command(("XADD", stream, "*", *fields)))
    return commands


def _listening(client: redis.Redis, consumers: int) -> bool:
    """Whether ``consumers`` consumers of the task group have made their first read."""
    stream = KEYS.tasks("default")
    if not client.exists(stream):
        return False
    groups = [g for g in client.xinfo_groups(stream) if g["name"].decode() == TASK_GROUP]
    return bool(groups) and int(groups[0]["consumers"]) >= consumers


def _time(
    url: str, client: redis.Redis, tasks: int, commands: list[list[str]], limit: int | None = None
) -> dict[str, Any]:
    client.delete(KEYS.tasks("default"), KEYS.lifecycle)
    if limit is None:
        remove_kind_limit(client, KEYS, "default")
    else:
        set_kind_limit(client, KEYS, "default", limit)
    fill = start_task_commands(tasks)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "workers", *command, "--redis-url", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for command in commands
    ]
    consumers = sum(
        int(c[c.index("--concurrency") + 1]) if "--concurrency" in c else 1 for c in commands
    )
    try:
        deadline = time.monotonic() + 60
        while not _listening(client, consumers) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # past their first read: idle, blocked on the stream
        client.config_resetstat()
        cpu = sum(_cpu_seconds(p.pid) for p in procs)
        server = redis_cpu_seconds(client)
        started = time.perf_counter()
        for first in range(0, tasks, 2000):
            execute(client, fill[first : first + 2000])
        while client.xlen(KEYS.lifecycle) < tasks:
            time.sleep(0.01)
        seconds = time.perf_counter() - started
        cpu = sum(_cpu_seconds(p.pid) for p in procs) - cpu
        server = redis_cpu_seconds(client) - server
        stats = client.info("commandstats")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
    ours = {"cmdstat_xlen", "cmdstat_info", "cmdstat_config|resetstat"}
    calls = sum(v["calls"] for k, v in stats.items() if k not in ours) - tasks  # the fill's XADDs
    return {
        "tasks": tasks,
        "seconds": seconds,
        "cpu_us": cpu / tasks * 1e6,
        "redis_us": server / tasks * 1e6,
        "commands": calls / tasks,
    }


# The same, its kind limited (lifecycle limit set default 1000: never reached, so what
# is measured is the slots' leasing, not waiting).
LIMITED = "the same, kind limited to 1,000 running"
NOOP_LIMITED = "workers noop, 1 process, kind limited to 1,000"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.noop_workers", description=__doc__)
    parser.add_argument("--tasks", type=int, default=50_000)
    args = parser.parse_args(argv)
    noop = ["noop", "--kinds", "default"]
    echo = ["run", "bench.noop_workers:Echo"]
    setups = {
        "workers noop, 1 process": [noop],
        NOOP_LIMITED: [noop],
        "workers noop, 2 processes": [noop, noop],
        "workers run Echo (TaskListener), --concurrency 4": [[*echo, "--concurrency", "4"]],
        LIMITED: [[*echo, "--concurrency", "4"]],
    }
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        print(f"{args.tasks} start-tasks, private Redis; per task: workers' CPU, Redis CPU,")
        print("the workers' Redis commands")
        for name, commands in setups.items():
            tasks = args.tasks if "noop" in name else args.tasks // 5
            f = _time(
                server.url,
                client,
                tasks,
                commands,
                1000 if name in (LIMITED, NOOP_LIMITED) else None,
            )
            print(
                f"{name:50} {tasks:6d} tasks {f['seconds']:5.2f} s {tasks / f['seconds']:7.0f}/s"
                f"  cpu {f['cpu_us']:5.1f} µs  redis {f['redis_us']:5.1f} µs"
                f"  {f['commands']:.3f} commands"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
