"""``python -m lifecycle limit [set | list | remove]``: concurrency limits per task kind.

At most N tasks of a kind run at once across all its workers
(:mod:`lifecycle.kind_limits`); workers see a change at their next task. Exit codes:
0 done; 2 a bad kind or limit; ``remove`` of a kind without a limit says so, exit 0.
"""

from __future__ import annotations

import argparse
from typing import Any

from lifecycle.cli.support import EXIT_OK, CliError, Context, print_json
from lifecycle.kind_limits import (
    BadKindLimit,
    list_kind_limits,
    remove_kind_limit,
    set_kind_limit,
)

__all__ = ["add_commands"]

EXAMPLES = """\
examples:
  python -m lifecycle limit set ml 2     # at most 2 ml:... tasks at once, on all workers
  python -m lifecycle limit list --json
  python -m lifecycle limit remove ml
"""


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    limit = commands.add_parser(
        "limit",
        help="concurrency limits per task kind: set, list, remove",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = limit.add_subparsers(dest="action", metavar="ACTION", required=True)

    setting = actions.add_parser(
        "set", parents=[common], help="at most N tasks of KIND run at once"
    )
    setting.add_argument("kind", metavar="KIND", help="task kind (name prefix before ':')")
    setting.add_argument("limit", metavar="N", help="how many at once (1 or more)")
    setting.set_defaults(func=_set)

    listing = actions.add_parser("list", parents=[common], help="limits, slots held, waiting")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=_list)

    removing = actions.add_parser("remove", parents=[common], help="lift the limit of KIND")
    removing.add_argument("kind", metavar="KIND", help="task kind")
    removing.set_defaults(func=_remove)


def _set(args: argparse.Namespace, context: Context) -> int:
    try:
        limit = int(args.limit)
    except ValueError:
        raise CliError(
            f"limit set {args.kind}: N {args.limit!r}, expected a whole number from 1"
        ) from None
    context.partitions  # noqa: B018 - checks --partitions against the stored count
    try:
        set_kind_limit(context.client, context.keys, args.kind, limit)
    except BadKindLimit as error:
        raise CliError(f"limit set: {error}") from error
    print(f"kind {args.kind}: at most {limit} at once")
    return EXIT_OK


def _remove(args: argparse.Namespace, context: Context) -> int:
    context.partitions  # noqa: B018 - checks --partitions against the stored count
    try:
        had = remove_kind_limit(context.client, context.keys, args.kind)
    except BadKindLimit as error:
        raise CliError(f"limit remove: {error}") from error
    print(f"kind {args.kind}: " + ("no limit any more" if had else "had no limit"))
    return EXIT_OK


def _list(args: argparse.Namespace, context: Context) -> int:
    context.partitions  # noqa: B018 - checks --partitions against the stored count
    limits = list_kind_limits(context.client, context.keys)
    if args.json:
        print_json([limit.summary() for limit in limits])
        return EXIT_OK
    if not limits:
        print("no limits")
        return EXIT_OK
    print("\t".join(("KIND", "LIMIT", "RUNNING", "WAITING")))
    for limit in limits:
        print(f"{limit.kind}\t{limit.limit}\t{limit.running}\t{limit.waiting}")
    return EXIT_OK
