"""A no-op task worker that also writes down every task it runs, outside Redis.

``python -m bench.counting_worker --runs DIR --redis-url URL [--cluster]`` serves
the default kind on every partition as ``python -m workers noop`` does, and appends
``<workflow> <key> <attempt>`` to ``DIR/partition-<i>.runs`` for each start-task it
answers. The failover benchmark counts task executions from these files: a count
kept in Redis would be lost with the very writes whose loss makes a task run twice.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from lifecycle.deployment import Deployment
from rqse.cluster import Connections
from rqse.connection import resolve_url
from rqse.runner import Runner
from workers.noop import NoopWorker

__all__ = ["CountingWorker", "main", "read_runs"]


class CountingWorker(NoopWorker):
    """A :class:`NoopWorker` that writes each start-task it answers to ``runs``."""

    def __init__(self, *args: Any, runs: TextIO, **options: Any) -> None:
        super().__init__(*args, **options)
        self._runs = runs
        self._lock = threading.Lock()

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        with self._lock:
            # Written before the answer is sent: a run whose answer Redis loses counts.
            self._runs.write(f"{event.get('workflow')} {event.get('key')} {event.get('attempt')}\n")
        return super().process(event_id, event)


def read_runs(directory: str | Path) -> list[tuple[str, str, str]]:
    """Every run written under ``directory``: (workflow, key, attempt), one per run."""
    runs = []
    for path in sorted(Path(directory).glob("partition-*.runs")):
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) == 3:
                runs.append((parts[0], parts[1], parts[2]))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.counting_worker", description=__doc__)
    parser.add_argument("--runs", required=True, help="directory for the run logs")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--cluster", action="store_true", help="Redis Cluster")
    parser.add_argument("--claim-idle", type=float, default=10.0, help="seconds before claiming")
    parser.add_argument("--consumer", default="counting", help="consumer name")
    args = parser.parse_args(argv)
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    connections = Connections.open(resolve_url(args.redis_url, None), cluster=args.cluster or None)
    deployment = Deployment(connections)
    files = []
    try:
        workers = []
        for index, keys in enumerate(deployment.partitions.all):
            runs = open(Path(args.runs) / f"partition-{index}.runs", "a", buffering=1)  # noqa: SIM115
            files.append(runs)
            workers.append(
                CountingWorker(
                    ["default"],
                    keys,
                    runs=runs,
                    pool=connections.pool_for(keys.prefix),
                    consumer=args.consumer,
                    claim_idle=args.claim_idle,
                    handle_signals=False,
                )
            )
        return Runner(workers).run()
    finally:
        for runs in files:
            runs.close()
        deployment.close()


if __name__ == "__main__":
    sys.exit(main())
