"""The ``run``, ``inspect`` and ``list`` commands (printing only; the work is elsewhere)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson
import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from flowlang.graph import Graph, NodeKind
from lifecycle import events as ev
from lifecycle.cli import EXIT_ERROR, EXIT_FAILED, EXIT_OK, compile_file, read_input
from lifecycle.inspect import describe_workflow, list_workflows
from lifecycle.keys import Keys
from lifecycle.submit import start_workflow

__all__ = ["inspect", "list_command", "print_json", "run", "show_workflow", "wait_for_end"]


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def run(args: argparse.Namespace, client: redis.Redis, keys: Keys) -> int:
    graph = compile_file(args.file)
    since = last_id(client, keys.lifecycle)
    workflow_id = start_workflow(client, graph, read_input(args.input), args.id, keys)
    print(workflow_id, flush=True)
    if not args.wait:
        return EXIT_OK
    event = wait_for_end(
        client, keys, workflow_id, graph, since, args.timeout, Console(stderr=True)
    )
    if event is None:
        print(f"error: workflow {workflow_id} did not end within {args.timeout}s", file=sys.stderr)
        return EXIT_ERROR
    if event["kind"] == ev.END_WORKFLOW:
        print_json(event.get("output"))
        return EXIT_OK
    print(
        f"workflow {workflow_id} {event.get('status', 'failed')}: {event.get('reason')}",
        file=sys.stderr,
    )
    return EXIT_FAILED


def last_id(client: redis.Redis, stream: str) -> str:
    last = client.xrevrange(stream, count=1)
    return last[0][0].decode() if last else "0-0"


def _task_total(graph: Graph) -> int:
    return sum(
        1
        for n in graph.nodes
        if n.kind is NodeKind.TASK
        or n.kind is NodeKind.SINK
        or (n.kind is NodeKind.SOURCE and n.name)
    )


def wait_for_end(
    client: redis.Redis,
    keys: Keys,
    workflow_id: str,
    graph: Graph,
    since: str,
    timeout: float | None,
    console: Console,
) -> dict[str, Any] | None:
    """Follow the lifecycle stream from ``since`` until the workflow's end event,
    showing ended/started tasks; None on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    workflow_key = keys.workflow(workflow_id)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task(workflow_id[:40], total=_task_total(graph))
        while deadline is None or time.monotonic() < deadline:
            reply = client.xread({keys.lifecycle: since}, count=500, block=200)
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    since = entry_id.decode()
                    kind = orjson.loads(fields.get(b"kind", b"null"))
                    if (
                        kind in (ev.END_WORKFLOW, ev.FAILED_WORKFLOW)
                        and orjson.loads(fields.get(b"workflow", b"null")) == workflow_id
                    ):
                        return {k.decode(): orjson.loads(v) for k, v in fields.items()}
            names = client.hkeys(workflow_key)
            started = sum(1 for n in names if n.startswith(b"n:"))
            ended = sum(1 for n in names if n.startswith(b"o:"))
            progress.update(bar, completed=ended, total=max(started, _task_total(graph), 1))
            final = _ended_from_record(client, keys, workflow_id)
            if final is not None:  # the end event was trimmed away before we read it
                return final
    return None


def _ended_from_record(client: redis.Redis, keys: Keys, workflow_id: str) -> dict[str, Any] | None:
    raw = client.hget(keys.workflow(workflow_id), "s")
    state = orjson.loads(raw) if raw else {}
    status = state.get("status")
    if status == "finished":
        return {"kind": ev.END_WORKFLOW, "workflow": workflow_id, "output": state.get("output")}
    if status in ("failed", "terminated"):
        return {
            "kind": ev.FAILED_WORKFLOW,
            "workflow": workflow_id,
            "status": status,
            "reason": state.get("error"),
        }
    return None


def inspect(args: argparse.Namespace, client: redis.Redis, keys: Keys) -> int:
    data = describe_workflow(client, keys, args.id)
    if args.json:
        print_json(data)
    else:
        console = Console()
        show_workflow(data, console)
        console.print("output: " + _short(data["output"], 2000))
    return EXIT_OK


def show_workflow(data: dict[str, Any], console: Console) -> None:
    """The workflow's state and a table of its task instances."""
    console.print(
        f"[bold]{data['id']}[/]  flow {data['flow'] or '-'}  state [bold]{data['state']}[/]"
    )
    console.print(f"created {data['created']}  ended {data['ended'] or '-'}")
    if data["error"]:
        console.print(f"[red]error:[/] {data['error']}")
    table = Table(
        "key", "task", "state", "attempts", "started", "ended", "worker", "input", "output"
    )
    for task in data["tasks"]:
        table.add_row(
            task["key"],
            task["name"] or task["kind"],
            task["state"],
            str(task["attempts"]),
            task["started"] or "",
            task["ended"] or "",
            task["worker"] or "",
            _short(task["input"]),
            _short(task["output"] if task["error"] is None else task["error"]),
        )
    console.print(table)


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def list_command(args: argparse.Namespace, client: redis.Redis, keys: Keys) -> int:
    rows = list_workflows(client, keys, args.state, args.flow)
    if args.json:
        print_json(rows)
        return EXIT_OK
    for row in rows:
        fields = (row["id"], row["flow"] or "-", row["state"], row["created"], row["ended"] or "-")
        print("\t".join(fields))
    return EXIT_OK
