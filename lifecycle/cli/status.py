"""``python -m lifecycle status [--json]``: streams, workers, workflows, and warnings.

Exit codes: 0 nothing to warn about; 1 at least one warning (a health check:
``python -m lifecycle status >/dev/null || alert``); 2 an error (Redis
unreachable, ...). The data is :func:`lifecycle.status.read_status`'s.
"""

from __future__ import annotations

import argparse
import socket
from typing import Any

from lifecycle.cli.support import EXIT_FAILED, EXIT_OK, CliError, Context, print_json
from lifecycle.inspect import iso
from lifecycle.liveness import find_alive, receipts_behind
from lifecycle.status import (
    COUNT_LIMIT,
    READ_GAP_S,
    STALE_S,
    Status,
    StreamInfo,
    format_ms,
    read_status,
)

__all__ = ["add_commands"]

EXAMPLES = """\
examples:
  python -m lifecycle status              # exit 1 when something needs attention
  python -m lifecycle status --json | jq .warnings
  python -m lifecycle status --alive      # probe: a worker on this host reads (exit 0) or not (1)
  python -m lifecycle status --alive --kind shop   # a task worker's probe names its kind
  python -m lifecycle status --receipts   # probe: the receipts worker keeps up
"""


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    status = commands.add_parser(
        "status",
        parents=[common],
        help="streams, workers, workflows by state, and what is wrong (exit 1 on a warning)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument(
        "--stale",
        type=float,
        default=STALE_S,
        metavar="SECONDS",
        help=f"a consumer silent this long is taken for gone (default {STALE_S:g}; "
        f"{READ_GAP_S:g} while entries wait undelivered and it holds none)",
    )
    status.add_argument(
        "--count-limit",
        type=int,
        default=COUNT_LIMIT,
        metavar="N",
        help=f"count the states of the newest N workflows (default {COUNT_LIMIT})",
    )
    # Probes answer for one process, not the deployment, and skip the workflow counts.
    probe = status.add_mutually_exclusive_group()
    probe.add_argument(
        "--alive",
        nargs="?",
        const=socket.gethostname(),
        metavar="CONSUMER",
        help="only check that a consumer named CONSUMER or CONSUMER-... (default: this "
        "host's name, which starts every default consumer name) read within --stale: "
        "exit 0, else 1 (a container's liveness probe)",
    )
    status.add_argument(
        "--kind",
        action="append",
        default=[],
        metavar="KIND",
        help="with --alive: also look at this task kind's stream (repeatable), for a "
        "worker of a kind no submitted flow has used yet",
    )
    probe.add_argument(
        "--receipts",
        action="store_true",
        help="only check that no entry waited for the receipts worker longer than --stale: "
        "exit 0, else 1 (the receipts worker's probe)",
    )
    status.set_defaults(func=_status)


def _status(args: argparse.Namespace, context: Context) -> int:
    if args.stale <= 0:
        raise CliError(f"--stale {args.stale:g}: expected seconds above 0")
    if args.count_limit < 0:
        raise CliError(f"--count-limit {args.count_limit}: expected 0 or more")
    if args.kind and args.alive is None:
        raise CliError("--kind goes with --alive (the kinds whose streams it looks at)")
    if args.alive is not None:
        return _alive(args, context)
    if args.receipts:
        return _receipts(args, context)
    places = context.each_partition()
    reports = [
        read_status(client, keys, stale_s=args.stale, count_limit=args.count_limit)
        for client, keys in places
    ]
    if args.json:
        if len(reports) == 1:
            print_json(reports[0].to_dict())
        else:
            print_json(
                {
                    "partitions": [
                        {"prefix": keys.prefix, **found.to_dict()}
                        for (_, keys), found in zip(places, reports, strict=True)
                    ]
                }
            )
    else:
        for (_, keys), found in zip(places, reports, strict=True):
            if len(reports) > 1:
                print(f"== partition {keys.prefix}")
            _print(found)
    return EXIT_FAILED if any(found.warnings for found in reports) else EXIT_OK


def _alive(args: argparse.Namespace, context: Context) -> int:
    if not args.alive:
        raise CliError("--alive '': expected a consumer name")
    # A worker reads every partition: alive on one is alive.
    alive, last = None, None
    for client, keys in context.each_partition():
        alive, seen = find_alive(client, keys, args.alive, args.stale, args.kind)
        if alive is not None:
            break
        if seen is not None and (last is None or seen.idle_ms < last.idle_ms):
            last = seen
    if alive is not None:
        print(
            f"alive: consumer {alive.consumer} of group {alive.group} on {alive.stream} "
            f"read {format_ms(alive.idle_ms)} ago"
        )
        return EXIT_OK
    if last is None:
        print(
            f"not alive: no consumer named {args.alive} or {args.alive}-... on the engine's "
            "streams (a worker of a kind no submitted flow has used yet: add --kind KIND)"
        )
    else:
        print(
            f"not alive: consumer {last.consumer} of group {last.group} on {last.stream} "
            f"last read {format_ms(last.idle_ms)} ago (--stale {args.stale:g} s)"
        )
    return EXIT_FAILED


def _receipts(args: argparse.Namespace, context: Context) -> int:
    behind = [
        line
        for client, keys in context.each_partition()
        for line in receipts_behind(client, keys, args.stale)
    ]
    if not behind:
        print(f"receipts: nothing waited longer than {args.stale:g} s")
        return EXIT_OK
    for line in behind:
        print(f"receipts behind: {line}")
    return EXIT_FAILED


def _print(found: Status) -> None:
    server = found.server
    memory = server.get("used_memory_human") or "?"
    print(
        f"redis {server.get('version')}  memory {memory}  "
        f"maxmemory-policy {server.get('maxmemory_policy')}"
    )
    workers = ", ".join(found.lifecycle_workers) or "none"
    print(f"lifecycle workers alive: {len(found.lifecycle_workers)} ({workers})")
    counts = found.workflows
    shown = "  ".join(
        f"{state} {n}" for state, n in counts.states.items() if n or state != "corrupt"
    )
    scope = f" (the newest {counts.scanned} of {counts.listed})" if counts.partial else ""
    print(f"workflows{scope}: {shown}")
    if counts.expiring:
        due = counts.next_removal_ms or 0
        when = iso(due) if due else "-"
        print(
            f"retention: {counts.expiring} ended workflows to compact or remove, the next at {when}"
        )
    if counts.ended_since_start:
        ended = "  ".join(f"{k} {v}" for k, v in sorted(counts.ended_since_start.items()))
        print(f"ended since the start: {ended}")
    print()
    print("\t".join(("STREAM", "LENGTH", "LAG", "PENDING", "DEAD", "CONSUMERS (idle)")))
    for info in [found.lifecycle, *found.kinds]:
        print(_stream_line(info))
    print()
    for note in found.notes:
        print(f"note: {note}")
    if found.warnings:
        for warning in found.warnings:
            print(f"WARNING: {warning}")
    else:
        print("no warnings")


def _stream_line(info: StreamInfo) -> str:
    group = info.group
    if group is None:
        lag, pending, consumers = str(info.length), "0", "no group yet"
    else:
        lag = f"{group.lag}{'+' if group.lag_capped else ''}"
        pending = str(group.pending)
        consumers = ", ".join(f"{c.name} ({format_ms(c.idle_ms)})" for c in group.consumers)
    return "\t".join(
        (info.source, str(info.length), lag, pending, str(info.dead_letters), consumers or "none")
    )
