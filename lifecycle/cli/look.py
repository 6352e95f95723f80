"""``inspect``, ``list`` and ``history``: looking at workflows (read only).

What cannot be read of a record is printed as ``corrupt record: field ...``
and the command goes on; the data comes from :mod:`lifecycle.inspect` and
:mod:`lifecycle.history`. An id with no workflow hash is one line, exit 2.
``inspect`` and ``history`` say when part of the timeline is no longer in
Redis and where it is.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lifecycle.cli.support import EXIT_OK, CliError, Context, dumps_text, print_json
from lifecycle.history import format_timeline, live_history, lost_streams, where_the_rest_is
from lifecycle.inspect import LIST_STATES, describe_workflow, list_workflows, read_workflow

__all__ = ["add_commands", "show_workflow"]


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    inspect = commands.add_parser("inspect", parents=[common], help="show one workflow")
    inspect.add_argument("id")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(func=_inspect)

    listing = commands.add_parser(
        "list", parents=[common], help="one line per workflow, newest first"
    )
    listing.add_argument("--state", help=f"only workflows in this state ({', '.join(LIST_STATES)})")
    listing.add_argument("--flow", help="only workflows of this flow name")
    listing.add_argument(
        "--limit", type=int, default=50, help="at most this many (default 50; 0: all)"
    )
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=_list)

    history = commands.add_parser("history", parents=[common], help="one workflow's timeline")
    history.add_argument("id")
    history.add_argument("--json", action="store_true", help="print JSON")
    history.set_defaults(func=_history)


def _inspect(args: argparse.Namespace, context: Context) -> int:
    client, keys = context.client, context.keys
    data = describe_workflow(client, keys, args.id)
    lost = lost_streams(client, keys, read_workflow(client, keys, args.id))
    data["timeline_lost"] = lost
    data["timeline_rest"] = where_the_rest_is(client, keys, args.id) if lost else None
    if args.json:
        print_json(data)
    else:
        console = Console()
        show_workflow(data, console)
        console.print("output: " + escape(_short(data["output"], 2000)))
        if lost:
            console.print(
                escape(
                    f"earlier events are no longer in Redis ({', '.join(lost)} trimmed): "
                    f"{data['timeline_rest']}"
                ),
                soft_wrap=True,
            )
    return EXIT_OK


def show_workflow(data: dict[str, Any], console: Console) -> None:
    """The workflow's state, what of it is corrupt, and a table of its task instances
    (``took``: from start to end, or to now while running; ``--json`` has the ends)."""
    console.print(
        f"[bold]{escape(data['id'])}[/]  flow {escape(data['flow'] or '-')}  "
        f"state [bold]{escape(data['state'])}[/]"
    )
    console.print(f"created {data['created'] or '-'}  ended {data['ended'] or '-'}")
    if data["error"]:
        console.print(f"[red]error:[/] {escape(data['error'])}")
    if data.get("paused") is not None:
        held = ", ".join(map(str, data["paused"])) or "none"
        console.print(f"paused: held start-tasks {escape(held)} (resume releases them)")
    for problem in data.get("corrupt", []):
        console.print(f"[red]{escape(problem)}[/]", soft_wrap=True)
    table = Table(
        "key",
        "task",
        "state",
        "attempts",
        "started",
        "took",
        "worker",
        "input",
        "output",
    )
    for task in data["tasks"]:
        ran = task["attempts"] is not None or task["started"] is not None
        table.add_row(
            *(
                escape(str(cell))
                for cell in (
                    task["key"],
                    task["name"] or task["kind"],
                    task["state"],
                    "" if task["attempts"] is None else task["attempts"],
                    task["started"] or "",
                    duration(task.get("duration_ms")),
                    task["worker"] or "",
                    _short(task["input"]) if ran else "",
                    _short(task["output"] if task["error"] is None else task["error"])
                    if ran
                    else "",
                )
            )
        )
    console.print(table)


def duration(ms: int | None) -> str:
    """``ms`` as people read it: ``850 ms``, ``12.5 s``, ``3 min 20 s``, ``2 h 5 min``."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(ms // 1000, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else dumps_text(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _list(args: argparse.Namespace, context: Context) -> int:
    if args.state is not None and args.state not in LIST_STATES:
        raise CliError(f"unknown state {args.state!r} (expected one of {', '.join(LIST_STATES)})")
    if args.limit < 0:
        raise CliError(f"--limit {args.limit}: expected 0 (all) or more")
    rows = list_workflows(context.client, context.keys, args.state, args.flow, args.limit)
    if args.json:
        print_json(rows)
        return EXIT_OK
    print("\t".join(("ID", "FLOW", "STATE", "CREATED", "ENDED")))
    for row in rows:
        fields = [row["id"], row["flow"] or "-", row["state"], row["created"] or "-"]
        fields.append(row["ended"] or "-")
        fields += row.get("corrupt", [])
        print("\t".join(fields))
    return EXIT_OK


def _history(args: argparse.Namespace, context: Context) -> int:
    data = live_history(context.client, context.keys, args.id)
    if args.json:
        print_json(data)
        return EXIT_OK
    print(f"workflow {args.id}: {data['state']}")
    if data["output"] is not None:
        print(f"  output: {dumps_text(data['output'])}")
    if data["error"]:
        print(f"  error: {data['error']}")
    for problem in data["corrupt"]:
        print(f"  {problem}")
    if not data["complete"]:
        print(
            f"  part of this timeline is no longer in Redis ({', '.join(data['lost'])} "
            f"trimmed): {data['rest']}"
        )
    for line in format_timeline(data["timeline"]):
        print(f"  {line}")
    return EXIT_OK
