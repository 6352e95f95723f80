"""``python -m lifecycle schedule``: add, list, pause, resume, remove and run-now schedules.

The lifecycle workers fire them (:mod:`lifecycle.engine.schedules`); these commands
only change what is stored (:mod:`lifecycle.schedules`).
"""

from __future__ import annotations

import argparse
from typing import Any

from lifecycle.cli.support import (
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    Context,
    compile_file,
    print_json,
    read_input,
)
from lifecycle.engine.retention import parse_duration
from lifecycle.errors import LifecycleError
from lifecycle.schedules import (
    CATCH_UP,
    CATCH_UP_CAP,
    OVERLAP,
    Schedule,
    Schedules,
    check_name,
)

__all__ = ["add_commands"]

EXAMPLES = f"""\
examples:
  python -m lifecycle schedule add nightly examples/orders.flow --cron "0 2 * * *" \\
      --timezone Europe/Berlin --input '{{"day": "today"}}'
  python -m lifecycle schedule add poll examples/orders.flow --every 30s --overlap allow
  python -m lifecycle schedule list
  python -m lifecycle list --schedule nightly

Fire times: --cron takes 5 fields, or 6 with seconds first ("*/10 * * * * *"), in
--timezone (default UTC; DST by croniter's rules); --every fires at the multiples of
the interval since the Unix epoch. The running lifecycle workers fire them, each
fire time once, as a workflow named NAME@<fire time, UTC>. --catch-up all starts at
most the latest {CATCH_UP_CAP} missed fire times.

exit codes: 0 done; 1 run-now started nothing (overlap skip: the last run still
runs); 2 a bad name, expression, time zone, flow or input, an unknown schedule,
Redis unreachable.
"""


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    schedule = commands.add_parser(
        "schedule",
        help="start a flow at cron or interval fire times",
        description="Schedules: a flow started by the lifecycle workers at the fire times "
        "of a cron expression or an interval.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = schedule.add_subparsers(dest="action", required=True, metavar="ACTION")

    add = actions.add_parser("add", parents=[common], help="add a schedule")
    add.add_argument("name", help="the schedule's name (letters, digits, '.', '_', '-')")
    add.add_argument("file", help="the .flow file ('-' for stdin), compiled and stored now")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help='cron expression, e.g. "0 2 * * *"')
    when.add_argument("--every", metavar="DURATION", help="interval, e.g. 30s, 15m, 1h")
    add.add_argument("--input", help="each run's input: JSON text, or @file.json")
    add.add_argument(
        "--overlap",
        choices=OVERLAP,
        default="skip",
        help="when the last run still runs at a fire time: skip the fire time (default), "
        "allow both, or cancel-previous (terminate it, then start)",
    )
    add.add_argument(
        "--catch-up",
        choices=CATCH_UP,
        default="one",
        help="fire times missed while no lifecycle worker ran: none, one (the latest, "
        f"default) or all (at most the latest {CATCH_UP_CAP})",
    )
    add.add_argument("--timezone", default="UTC", metavar="TZ", help="for --cron, default UTC")
    add.add_argument(
        "--priority", type=int, default=0, metavar="N", help="each run's priority, default 0"
    )
    add.add_argument(
        "--concurrency-key",
        metavar="KEY",
        help="with --max-running: at most N workflows of KEY run at once (runs wait in line)",
    )
    add.add_argument("--max-running", type=int, metavar="N", help="see --concurrency-key")
    add.set_defaults(func=_add)

    listing = actions.add_parser(
        "list", parents=[common], help="every schedule, its next fire time and last run"
    )
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=_list)

    for action, text in (
        ("pause", "fire nothing until resumed"),
        ("resume", "fire again from the next fire time (no catch-up of the pause)"),
        ("remove", "forget the schedule (its workflows stay)"),
        ("run-now", "start one run now, under the overlap policy"),
    ):
        command = actions.add_parser(action, parents=[common], help=text)
        command.add_argument("name", help="the schedule's name")
        command.set_defaults(func=_control)


def _add(args: argparse.Namespace, context: Context) -> int:
    check_name(args.name)
    every_ms = None
    if args.every is not None:
        try:
            every_ms = round(parse_duration(args.every) * 1000)
        except LifecycleError as error:
            raise CliError(f"--every {error}") from None
    graph = compile_file(args.file)
    value = read_input(args.input)
    spec = Schedule(
        name=args.name,
        graph=graph.content_hash(),
        flow=graph.name,
        file=args.file,
        cron=args.cron,
        every_ms=every_ms,
        timezone=args.timezone,
        overlap=args.overlap,
        catch_up=args.catch_up,
        input=value,
        priority=args.priority,
        concurrency_key=args.concurrency_key,
        max_running=args.max_running,
    )
    if args.concurrency_key is not None:
        # The runs live in the schedule's partition; the key's gate must be there too.
        context.partitions.check_placed(f"{{{spec.name}}}", args.concurrency_key)
    schedules = Schedules(*context.for_tag(spec.name))
    first = schedules.add(spec, graph)
    print(f"schedule {spec.name}: {spec.when}, first run {schedules.run_id(spec.name, first)}")
    return EXIT_OK


def _list(args: argparse.Namespace, context: Context) -> int:
    rows = sorted(
        (row for place in context.each_partition() for row in Schedules(*place).describe()),
        key=lambda row: str(row["name"]),
    )
    if args.json:
        print_json(rows)
        return EXIT_OK
    print("\t".join(("NAME", "FLOW", "SCHEDULE", "TZ", "NEXT", "LAST RUN", "STATE", "OVERLAP")))
    for row in rows:
        catch_up = row["catch_up"]
        if catch_up == "all":
            catch_up = f"all (at most {row['catch_up_cap']})"
        cells = [
            row["name"],
            row["flow"] or "-",
            row["schedule"],
            row["timezone"],
            "paused" if row["paused"] else row["next"],
            row["last_run"] or "-",
            row["last_state"] or ("-" if row["last_run"] is None else "gone"),
            f"{row['overlap']}, catch-up {catch_up}",
        ]
        print("\t".join(cells))
    return EXIT_OK


def _control(args: argparse.Namespace, context: Context) -> int:
    name = check_name(args.name)
    schedules = Schedules(*context.for_tag(name))
    if args.action == "pause":
        print(f"schedule {name}: {'paused' if schedules.pause(name) else 'already paused'}")
    elif args.action == "resume":
        first = schedules.resume(name)
        if first is None:
            print(f"schedule {name}: not paused")
        else:
            print(f"schedule {name}: resumed, next run {schedules.run_id(name, first)}")
    elif args.action == "remove":
        schedules.remove(name)
        print(f"schedule {name}: removed")
    else:
        fired = schedules.run_now(name)
        if not fired.runs:
            print(f"schedule {name}: skipped: its last run {fired.last} still runs (overlap skip)")
            return EXIT_FAILED
        print(fired.runs[0])
    return EXIT_OK
