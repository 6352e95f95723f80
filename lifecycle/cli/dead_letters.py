"""``python -m lifecycle dead-letters [list | show | requeue | purge]``.

``dead-letters`` alone lists them. Dead letters of the lifecycle stream and of
every task kind, each with its reason (:mod:`lifecycle.dead_letters`). Exit
codes: 0 done; 2 an unknown id or kind, a dead letter that cannot be requeued,
``purge`` without ``--yes``.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

import redis

from lifecycle.cli.support import EXIT_OK, CliError, Context, print_json
from lifecycle.dead_letters import (
    DeadLetter,
    UnknownDeadLetter,
    find_dead_letter,
    list_dead_letters,
    purge,
    requeue,
)

__all__ = ["add_commands"]

LIST_LIMIT = 0  # list's default --limit: every dead letter

EXAMPLES = """\
examples:
  python -m lifecycle dead-letters                # the same as: dead-letters list
  python -m lifecycle dead-letters show 1700000000000-0
  python -m lifecycle restart order-1             # a dead-lettered start-task: run it again
  python -m lifecycle dead-letters purge --kind ml --yes
"""

REQUEUE_HELP = """\
A dead-lettered start-task has already failed its task: the lifecycle worker
answered it with a failure, so the workflow retried it or failed. To run that
task again once its worker is fixed, restart the workflow
(python -m lifecycle restart ID): requeuing the start-task runs the old attempt,
whose answer the lifecycle refuses as stale. Requeue is for dead-lettered
lifecycle events (a lifecycle worker that could not read them).
"""


def _without_defaults(parent: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A copy of ``parent`` whose options set nothing unless given: an action's parser
    would otherwise overwrite, with its defaults, what was given before the action
    (``dead-letters --redis-url X list``). ``dead-letters`` itself holds the defaults."""
    quiet = copy.deepcopy(parent)
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
    return quiet


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    kind = argparse.ArgumentParser(add_help=False)
    kind.add_argument(
        "--kind", help="only this source: 'lifecycle' or a task kind (default: every one)"
    )
    listed = argparse.ArgumentParser(add_help=False)
    listed.add_argument(
        "--limit",
        type=int,
        default=LIST_LIMIT,
        help=f"list at most this many (default {LIST_LIMIT}: all)",
    )
    listed.add_argument("--json", action="store_true", help="print JSON")
    # Bare ``dead-letters`` lists: it takes list's options and holds every default.
    dead = commands.add_parser(
        "dead-letters",
        parents=[common, kind, listed],
        help="entries a worker gave up on, with the reason: list (default), show, requeue, purge",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dead.set_defaults(func=_list)
    common, kind = _without_defaults(common), _without_defaults(kind)
    actions = dead.add_subparsers(dest="action", metavar="ACTION")

    listing = actions.add_parser(
        "list", parents=[common, kind, _without_defaults(listed)], help="one line each (default)"
    )
    listing.set_defaults(func=_list)

    # An entry id is unique in its stream only: with several partitions, the same id may
    # name a dead letter in more than one.
    which = argparse.ArgumentParser(add_help=False)
    which.add_argument(
        "--partition",
        type=int,
        metavar="I",
        help="look only in partition I (when the id names dead letters in several)",
    )
    show = actions.add_parser("show", parents=[common, kind, which], help="one in full")
    show.add_argument("id", help="the dead letter's id (from list)")
    show.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    show.set_defaults(func=_show)

    again = actions.add_parser(
        "requeue",
        parents=[common, kind, which],
        help="deliver to its stream again (once: the dead letter goes in the same step)",
        description=REQUEUE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    again.add_argument("ids", nargs="*", metavar="ID", help="dead letter ids")
    again.add_argument("--all", action="store_true", help="every one (of --kind)")
    again.set_defaults(func=_requeue)

    remove = actions.add_parser(
        "purge",
        parents=[common, kind],
        help="delete them for good (the receipts archive keeps what it archived)",
    )
    remove.add_argument("--yes", action="store_true", help="really delete")
    remove.set_defaults(func=_purge)


def _list(args: argparse.Namespace, context: Context) -> int:
    if args.limit < 0:
        raise CliError(f"--limit {args.limit}: expected 0 (all) or more")
    letters = [
        letter
        for client, keys in context.each_partition()
        for letter in list_dead_letters(client, keys, args.kind, args.limit)
    ]
    if args.limit:
        letters = letters[: args.limit]
    if args.json:
        print_json([letter.summary() for letter in letters])
        return EXIT_OK
    if not letters:
        print("no dead letters")
        return EXIT_OK
    print("\t".join(("ID", "KIND", "AT", "REASON", "EVENT", "WORKFLOW", "ERROR")))
    for letter in letters:
        event = letter.event
        what = str(event.get("kind", "-"))
        if "key" in event:
            what += f" {event.get('name') or ''}({event['key']})"
        print(
            "\t".join(
                (
                    letter.id,
                    letter.source,
                    letter.at or "-",
                    letter.reason or "-",
                    _one_line(what, 80),  # (any text: a kind only a garbage entry had)
                    _one_line(str(event.get("workflow", "-")), 80),
                    _one_line(letter.error or "-"),
                )
            )
        )
    return EXIT_OK


def _show(args: argparse.Namespace, context: Context) -> int:
    _, letter = _find(context, args.id, args.kind, args.partition)
    if args.json:
        print_json(letter.summary())
        return EXIT_OK
    _print_letter(letter)
    return EXIT_OK


def _print_letter(letter: DeadLetter) -> None:
    print(f"dead letter {letter.id} of {letter.source} (dead-lettered {letter.at})")
    print(f"  reason: {letter.reason or '-'}")
    print(f"  error: {letter.error or '-'}")
    print(f"  entry: {letter.original_id or '-'} of {letter.stream or '-'}")
    times = "?" if letter.deliveries is None else letter.deliveries
    print(
        f"  given up by: consumer {letter.consumer or '-'} of group {letter.group or '-'} "
        f"after {times} {'delivery' if times == 1 else 'deliveries'}"
    )
    if letter.fields is None:
        print(f"  fields: not kept ({letter.size} bytes)")
    else:
        print("  fields:")
        for name, value in letter.fields.items():
            print(f"    {name}: {value}")
    if letter.traceback:
        print("  traceback:")
        for line in letter.traceback.splitlines():
            print(f"    {line}")


def _find(
    context: Context, dead_id: str, kind: str | None, partition: int | None = None
) -> tuple[redis.Redis, DeadLetter]:
    """The dead letter ``dead_id`` and its partition's client: looked for in every
    partition (an entry id does not say which), or in ``partition`` alone."""
    places = context.each_partition()
    if partition is not None:
        if not 0 <= partition < len(places):
            raise CliError(f"--partition {partition}: the deployment has 0 to {len(places) - 1}")
        places = [places[partition]]
    found = []
    for client, keys in places:
        try:
            found.append((client, keys, find_dead_letter(client, keys, dead_id, kind)))
        except UnknownDeadLetter:
            if len(places) == 1:
                raise
    if not found:
        raise UnknownDeadLetter(f"no dead letter {dead_id!r} in any partition")
    if len(found) > 1:
        where = ", ".join(str(context.partitions.all.index(keys)) for _, keys, _ in found)
        raise CliError(
            f"dead letter {dead_id!r} is in several partitions ({where}): add --partition I"
        )
    client, _, letter = found[0]
    return client, letter


def _requeue(args: argparse.Namespace, context: Context) -> int:
    if args.all == bool(args.ids):
        raise CliError("requeue: give dead letter ids or --all (not both)")
    if args.all:
        letters = [
            (client, letter)
            for client, keys in context.each_partition()
            for letter in list_dead_letters(client, keys, args.kind)
        ]
    else:  # every id checked first: a typo requeues none of them
        letters = [_find(context, dead_id, args.kind, args.partition) for dead_id in args.ids]
    again = 0
    for client, letter in letters:
        done = requeue(client, letter)
        if done.new_id is None:
            print(f"{done.id}: no longer there (requeued or purged meanwhile): not sent")
        else:
            again += 1
            print(f"{done.id}: requeued to {done.stream} as {done.new_id}")
    print(f"{again} requeued")
    return EXIT_OK


def _purge(args: argparse.Namespace, context: Context) -> int:
    places = context.each_partition()
    if not args.yes:
        count = sum(len(list_dead_letters(client, keys, args.kind)) for client, keys in places)
        if not count:
            print("no dead letters")
            return EXIT_OK
        raise CliError(f"purge deletes {count} dead letters for good: add --yes to do it")
    removed: dict[str, int] = {}
    for client, keys in places:
        for source, count in purge(client, keys, args.kind).items():
            removed[source] = removed.get(source, 0) + count
    for source, count in removed.items():
        print(f"{source}: {count} deleted")
    print(f"{sum(removed.values())} deleted")
    return EXIT_OK


def _one_line(text: str, limit: int = 120) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
