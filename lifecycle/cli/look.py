"""``inspect``, ``list`` and ``history``: looking at workflows (read only).

What cannot be read of a record is printed as ``corrupt record: field ...``
and the command goes on; the data comes from :mod:`lifecycle.inspect` and
:mod:`lifecycle.history`. An id with no workflow hash is one line, exit 2.
``inspect`` and ``history`` say when part of the timeline is no longer in
Redis and where it is.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lifecycle.cli.support import EXIT_OK, CliError, Context, dumps_text, print_json
from lifecycle.history import format_timeline, inspected, live_history
from lifecycle.inspect import (
    LIST_STATES,
    archive_record,
    list_workflows,
    newest,
)
from lifecycle.schedules import Schedules

__all__ = ["add_commands", "show_workflow"]


HISTORY_EXAMPLES = """\
examples:
  python -m lifecycle history order-2
  python -m lifecycle history order-2 --archive /var/lib/flow/receipts
"""


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
    listing.add_argument("--schedule", metavar="NAME", help="only workflows this schedule started")
    listing.add_argument(
        "--limit", type=int, default=50, help="at most this many (default 50; 0: all)"
    )
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=_list)

    history = commands.add_parser(
        "history",
        parents=[common],
        help="one workflow's timeline",
        epilog=HISTORY_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    history.add_argument("id")
    history.add_argument("--json", action="store_true", help="print JSON")
    source = history.add_mutually_exclusive_group()
    source.add_argument(
        "--archive",
        metavar="DIR",
        help="read the part of the timeline no longer in Redis from this receipts archive "
        "(default: the one the receipts worker recorded, when it is on this host; it reads "
        "the whole archive)",
    )
    source.add_argument("--no-archive", action="store_true", help="only what Redis still holds")
    history.set_defaults(func=_history)


def _inspect(args: argparse.Namespace, context: Context) -> int:
    data = inspected(*context.for_workflow(args.id), args.id)
    lost = data["timeline_lost"]
    if args.json:
        print_json(data)
    else:
        console = Console()
        show_workflow(data, console)
        console.print("output: " + escape(_short(data["output"], 2000)), soft_wrap=True)
        if lost:
            console.print(
                escape(
                    f"earlier events are no longer in Redis ({', '.join(lost)} trimmed): "
                    f"{data['timeline_rest']}"
                ),
                soft_wrap=True,
            )
        console.print("(--json for every field)")
    return EXIT_OK


COLUMNS = ("key", "task", "state", "attempts", "started", "took", "worker", "input", "output")
_GAP = 2  # spaces between two columns of the table
_PLAIN_LIMIT = 100  # characters of an input or output on a plain (piped) line
_MIN_VALUE = 10  # narrower than this, an input or output column says nothing


def show_workflow(data: dict[str, Any], console: Console) -> None:
    """The workflow's state, what of it is corrupt, and its task instances (``took``:
    from start to end, or to now while running; ``--json`` has the ends).

    On a terminal, a table as wide as the terminal: every cell on one line, the
    state, attempts, key and duration never shortened, the input and output (then
    the task and worker names) shortened with an ellipsis to fit, the input left
    out first. Otherwise (piped) tab-separated lines, values up to 100 characters.
    """
    console.print(
        f"[bold]{escape(data['id'])}[/]  flow {escape(data['flow'] or '-')}  "
        f"state [bold]{escape(data['state'])}[/]"
    )
    priority = f"  priority {data['priority']}" if data.get("priority") else ""
    console.print(
        f"created {data['created'] or '-'}  ended {data['ended'] or '-'}{priority}", soft_wrap=True
    )
    if data["error"]:
        console.print(f"[red]error:[/] {escape(one_line(data['error']))}", soft_wrap=True)
    if data.get("paused") is not None:
        console.print(escape(paused_line(data)), soft_wrap=True)
    for problem in data.get("corrupt", []):
        console.print(f"[red]{escape(problem)}[/]", soft_wrap=True)
    if data.get("compacted"):
        console.print(
            escape(
                f"task records compacted {data['compacted']}, once it had finished (the "
                f"archive keeps them: python -m lifecycle history {data['id']})"
            ),
            soft_wrap=True,
        )
    if console.is_terminal:
        if data["tasks"]:  # (none once compacted, said above: no empty table)
            _table([_cells(task, data["created"]) for task in data["tasks"]], console)
        return
    # Tab-separated for grep, cut and awk: written as is (rich would expand the tabs).
    for row in [[c.upper() for c in COLUMNS], *(_cells(t, None) for t in data["tasks"])]:
        cells = (cell if i < 7 else _short(cell, _PLAIN_LIMIT) for i, cell in enumerate(row))
        console.file.write("\t".join(cells) + "\n")


def paused_line(data: dict[str, Any]) -> str:
    """What a paused workflow holds, each step by name and key: ``B (6)``."""
    names = {task["key"]: task["name"] for task in data["tasks"]}
    held = [f"{names[k]} ({k})" if names.get(k) else k for k in map(str, data["paused"])]
    if not held:
        return "paused: no start-task held yet (the next one to start waits for resume)"
    return f"paused: held start-tasks {', '.join(held)} (resume releases them)"


def _cells(task: dict[str, Any], created: str | None) -> list[str]:
    ran = task["attempts"] is not None or task["started"] is not None
    started = task["started"] or "-"
    if created and started[:10] == created[:10]:
        started = started[11:19]  # the day is the created line's; --json has the ms
    value = task["output"] if task["error"] is None else task["error"]
    return [
        str(task["key"]),
        str(task["name"] or task["kind"]),
        str(task["state"]),
        "-" if task["attempts"] is None else str(task["attempts"]),
        started,
        duration(task.get("duration_ms")) or "-",
        task["worker"] or "-",
        one_line(task["input"]) if ran else "-",
        one_line(value) if ran and (value is not None or task["state"] == "ended") else "-",
    ]


def _table(rows: list[list[str]], console: Console) -> None:
    """``rows`` as a table that fits ``console.width`` (see :func:`show_workflow`)."""
    columns = list(range(len(COLUMNS)))
    widths = [max([len(COLUMNS[i]), *(cell_len(r[i]) for r in rows)]) for i in columns]

    def excess() -> int:
        return sum(widths[i] for i in columns) + _GAP * (len(columns) - 1) - console.width

    io = (7, 8)  # input, output: share what is left, the output first
    if excess() > 0:
        room = sum(widths[i] for i in io) - excess()
        if room >= 2 * _MIN_VALUE:
            widths[8] = min(widths[8], max(room // 2, room - widths[7]))
            widths[7] = room - widths[8]
        else:
            columns.remove(7)
    # Still too wide: the output, then the names, shortened by turns.
    for i, least in ((8, 2 * _MIN_VALUE), (1, 12), (6, 12), (8, _MIN_VALUE), (1, 8), (6, 8)):
        over = excess()
        if over > 0 and i in columns:
            widths[i] = max(min(least, widths[i]), widths[i] - over)
    for i in (8, 4, 6):  # narrower yet: the output, start and worker left out (--json)
        if excess() > 0:
            columns.remove(i)
    table = Table(box=None, pad_edge=False, padding=(0, _GAP // 2), header_style="bold")
    for i in columns:
        table.add_column(COLUMNS[i], no_wrap=True, width=widths[i], overflow="ellipsis")
    for row in rows:
        table.add_row(*(escape(_short(row[i], widths[i])) for i in columns))
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


def one_line(value: Any) -> str:
    """``value`` as one line: a string's runs of white space (newlines too) as one
    space, anything else as compact JSON."""
    return " ".join(value.split()) if isinstance(value, str) else dumps_text(value)


def _short(value: Any, limit: int = 60) -> str:
    text = one_line(value)
    return text if cell_len(text) <= limit else set_cell_size(text, limit - 1) + "…"


def _list(args: argparse.Namespace, context: Context) -> int:
    if args.state is not None and args.state not in LIST_STATES:
        raise CliError(f"unknown state {args.state!r} (expected one of {', '.join(LIST_STATES)})")
    if args.limit < 0:
        raise CliError(f"--limit {args.limit}: expected 0 (all) or more")
    if args.schedule is not None:  # an unknown schedule is an error, not an empty list
        client, keys = context.for_tag(args.schedule)
        Schedules(client, keys).get(args.schedule)
        index = keys.schedule_runs(args.schedule)
        rows = list_workflows(client, keys, args.state, args.flow, args.limit, index=index)
    else:
        rows = newest(
            [
                list_workflows(client, keys, args.state, args.flow, args.limit)
                for client, keys in context.each_partition()
            ],
            args.limit,
        )
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
    archive: str | None = args.archive
    if archive is not None and not os.path.isdir(archive):
        raise CliError(f"--archive {archive}: no such directory (a receipts worker's --archive)")
    client, keys = context.for_workflow(args.id)
    if archive is not None:
        archive = str(context.partitions.archive(archive, context.partitions.index_of(args.id)))
    elif not args.no_archive:
        recorded = archive_record(client, keys)
        archive = recorded.path if recorded is not None and recorded.here() else None
    data = live_history(client, keys, args.id, archive)
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
    if data["archive"] is not None:
        archived = sum(1 for row in data["timeline"] if row.get("archived"))
        print(f"  {archived} events read from the archive {data['archive']}: marked (archive)")
    if not data["complete"]:
        print(
            f"  part of this timeline is no longer in Redis ({', '.join(data['lost'])} "
            f"trimmed): {data['rest']}"
        )
    for line in format_timeline(data["timeline"]):
        print(f"  {line}")
    return EXIT_OK
