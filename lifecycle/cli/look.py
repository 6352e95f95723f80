"""``inspect``, ``list`` and ``history``: looking at workflows (read only).

What cannot be read of a record is printed as ``corrupt record: field ...``
and the command goes on; the data comes from :mod:`lifecycle.inspect` and
:mod:`lifecycle.history`.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lifecycle.cli.support import EXIT_OK, Context, dumps_text, print_json
from lifecycle.history import format_timeline, live_history
from lifecycle.inspect import describe_workflow, list_workflows

__all__ = ["add_commands", "show_workflow"]


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    inspect = commands.add_parser("inspect", parents=[common], help="show one workflow")
    inspect.add_argument("id")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(func=_inspect)

    listing = commands.add_parser("list", parents=[common], help="one line per workflow")
    listing.add_argument("--state", help="only workflows in this state (running, finished, ...)")
    listing.add_argument("--flow", help="only workflows of this flow name")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=_list)

    history = commands.add_parser("history", parents=[common], help="one workflow's timeline")
    history.add_argument("id")
    history.add_argument("--json", action="store_true", help="print JSON")
    history.set_defaults(func=_history)


def _inspect(args: argparse.Namespace, context: Context) -> int:
    data = describe_workflow(context.client, context.keys, args.id)
    if args.json:
        print_json(data)
    else:
        console = Console()
        show_workflow(data, console)
        console.print("output: " + escape(_short(data["output"], 2000)))
    return EXIT_OK


def show_workflow(data: dict[str, Any], console: Console) -> None:
    """The workflow's state, what of it is corrupt, and a table of its task instances."""
    console.print(
        f"[bold]{escape(data['id'])}[/]  flow {escape(data['flow'] or '-')}  "
        f"state [bold]{escape(data['state'])}[/]"
    )
    console.print(f"created {data['created'] or '-'}  ended {data['ended'] or '-'}")
    if data["error"]:
        console.print(f"[red]error:[/] {escape(data['error'])}")
    for problem in data.get("corrupt", []):
        console.print(f"[red]{escape(problem)}[/]", soft_wrap=True)
    table = Table(
        "key", "task", "state", "attempts", "started", "ended", "worker", "input", "output"
    )
    for task in data["tasks"]:
        table.add_row(
            *(
                escape(str(cell))
                for cell in (
                    task["key"],
                    task["name"] or task["kind"],
                    task["state"],
                    task["attempts"],
                    task["started"] or "",
                    task["ended"] or "",
                    task["worker"] or "",
                    _short(task["input"]),
                    _short(task["output"] if task["error"] is None else task["error"]),
                )
            )
        )
    console.print(table)


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else dumps_text(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _list(args: argparse.Namespace, context: Context) -> int:
    rows = list_workflows(context.client, context.keys, args.state, args.flow)
    if args.json:
        print_json(rows)
        return EXIT_OK
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
        print("  (streams trimmed: earlier events are only in the archive; use replay)")
    for line in format_timeline(data["timeline"]):
        print(f"  {line}")
    return EXIT_OK
