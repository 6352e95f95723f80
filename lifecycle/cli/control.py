"""``terminate``, ``pause``, ``resume``, ``restart``, ``delete``: control workflows.

One workflow by id (the command waits until a lifecycle worker has applied the
action and prints the new state), several ids, or every workflow a filter
selects (``--state``, ``--flow``: the events are sent, not awaited). All go
through :class:`lifecycle.client.Client`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.cli.support import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError, Context
from lifecycle.client import Client, Selection, WorkflowStatus
from lifecycle.errors import UnknownWorkflow

__all__ = ["add_commands"]

_HELP = {
    ev.TERMINATE_WORKFLOW: "stop workflows: nothing new starts, running tasks are told",
    ev.PAUSE_WORKFLOW: "hold workflows: no task starts until resumed",
    ev.RESUME_WORKFLOW: "release paused workflows: what was held starts, in order",
    ev.RESTART_WORKFLOW: "run failed or terminated workflows on from where they stopped",
    ev.DELETE_WORKFLOW: "remove ended workflows from Redis (the archive keeps them)",
}


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    for kind in ev.CONTROLS:
        name = kind.removesuffix("-workflow")
        parser = commands.add_parser(name, parents=[common], help=_HELP[kind])
        parser.add_argument("ids", nargs="*", metavar="ID", help="workflow ids")
        parser.add_argument(
            "--state", choices=rec.SHOWN_STATES, help="every workflow in this state"
        )
        parser.add_argument("--flow", help="every workflow of this flow name")
        if kind == ev.TERMINATE_WORKFLOW:
            parser.add_argument("--reason", default="terminated", help="recorded as its error")
        parser.add_argument(
            "--timeout",
            type=float,
            default=10.0,
            metavar="SECONDS",
            help="for one id: how long to wait for a lifecycle worker to apply it (default 10)",
        )
        parser.add_argument(
            "--no-wait", action="store_true", help="send the event and return at once"
        )
        parser.set_defaults(func=_command(kind))


def _command(kind: str) -> Any:
    def run(args: argparse.Namespace, context: Context) -> int:
        client = Client(context.client, context.keys)
        reason = getattr(args, "reason", "")
        bulk = args.state is not None or args.flow is not None
        if not args.ids and not bulk:
            raise CliError("give workflow ids, or select workflows with --state or --flow")
        if len(args.ids) == 1 and not bulk:
            return _one(client, kind, args.ids[0], reason, 0.0 if args.no_wait else args.timeout)
        return _many(client, kind, args, reason)

    return run


def _one(client: Client, kind: str, workflow_id: str, reason: str, wait: float) -> int:
    applied = client.control(kind, workflow_id, reason, wait=wait)
    verb = kind.removesuffix("-workflow")
    if applied.event_id is None:
        print(f"workflow {workflow_id}: already {applied.state}")
    elif wait <= 0:
        print(f"workflow {workflow_id}: {verb} sent (event {applied.event_id})")
    elif applied.state is None:
        print(
            f"workflow {workflow_id}: {verb} sent (event {applied.event_id}) but not applied "
            f"within {wait:g}s: is a lifecycle worker running? (python -m lifecycle status)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    else:
        print(f"workflow {workflow_id}: {applied.state}")
    return EXIT_OK


def _many(client: Client, kind: str, args: argparse.Namespace, reason: str) -> int:
    selection = Selection(args.state, args.flow)
    unknown: list[str] = []
    targets: list[WorkflowStatus] = []
    for workflow_id in args.ids:
        try:
            status = client.status(workflow_id)
        except UnknownWorkflow:
            unknown.append(workflow_id)
            continue
        if selection.matches(status):
            targets.append(status)
    if not args.ids:
        targets = list(client.select(selection))
    sent, refused = client.control_many(kind, targets, reason)
    verb = kind.removesuffix("-workflow")
    print(f"{verb} sent to {len(sent):,} workflow{'s' if len(sent) != 1 else ''}")
    for workflow_id, why in refused[:10]:
        print(f"  not {workflow_id}: {why}", file=sys.stderr)
    if len(refused) > 10:
        print(f"  ... and {len(refused) - 10:,} more not allowed", file=sys.stderr)
    for workflow_id in unknown:
        print(f"error: no workflow {workflow_id!r} in Redis", file=sys.stderr)
    if unknown:
        return EXIT_USAGE
    return EXIT_FAILED if refused and args.ids else EXIT_OK
