"""``terminate``, ``pause``, ``resume``, ``restart``, ``delete``: control workflows.

Ids (each one waited for and reported on a line of its own), every workflow the
filters select (``--state``, ``--flow``: sent without waiting, one summary line),
or both (the filters then narrow the ids). All go through
:class:`lifecycle.client.Client`.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections import Counter
from typing import Any

from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.cli.support import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError, Context
from lifecycle.client import ACTS_ON, Applied, Client, Selection, WorkflowStatus
from lifecycle.inspect import no_workflow

__all__ = ["add_commands", "describe"]

DEFAULT_REASON = "terminated"
DEFAULT_TIMEOUT = 10.0
_EXAMPLES_SHOWN = 3  # ids named per reason in a filter's summary

_HELP = {
    ev.TERMINATE_WORKFLOW: "stop workflows: nothing new starts, running tasks are told",
    ev.PAUSE_WORKFLOW: "hold workflows: no task starts until resumed",
    ev.RESUME_WORKFLOW: "release paused workflows: what was held starts, in order",
    ev.RESTART_WORKFLOW: "run failed or terminated workflows on from where they stopped",
    ev.DELETE_WORKFLOW: "remove ended workflows from Redis (the archive keeps them)",
}

_WHAT = {
    ev.TERMINATE_WORKFLOW: "Stop workflows: nothing new starts, running tasks see "
    "task.cancelled() turn true, their queued tasks are skipped; the state becomes "
    "'terminated', with --reason as its error. Applies to running and paused workflows.",
    ev.PAUSE_WORKFLOW: "Hold workflows: no task starts until resumed; ends of running tasks "
    "are still recorded. Applies to running workflows.",
    ev.RESUME_WORKFLOW: "Release paused workflows: the tasks held while paused start, in the "
    "order they were held. Applies to paused workflows.",
    ev.RESTART_WORKFLOW: "Run failed or terminated workflows on from where they stopped: the "
    "tasks that were running, held or failed start again as their next attempt; what ended "
    "well is not run again. Applies to failed and terminated workflows.",
    ev.DELETE_WORKFLOW: "Remove ended workflows' records from Redis (the receipts archive "
    "keeps their history). Applies to finished, failed and terminated workflows.",
}

_HOW = """
Give ids, filters (--state, --flow), or both: ids and filters combine as AND (an id the
filters do not match is skipped, and said so); at least one id or filter is needed.

For ids, the command waits until a lifecycle worker has applied the action to each
(--timeout covers all the ids together; --no-wait sends and returns) and prints one
line per id: 'workflow ID: {done}'{other}, 'not allowed: <why>',
'not in state S (it is T), skipped', '{verb} sent (event E)' with --no-wait.
With filters alone the events are sent without waiting, and one line says how many were
sent and how many matched but were skipped, and why.

exit codes: 0 done or already so (filters alone: every match sent or skipped);
1 a workflow's state does not allow it, it ended before the action reached it, or a
lifecycle worker did not apply it within --timeout; 2 an unknown id (after acting on the
others), bad arguments, Redis unreachable.
"""

# The lines besides the plain outcome and the refusals, as the help lists them.
_ENDED_FIRST = (
    " (or, when it ended first,\n'finished before the {verb} reached it'), 'already {done}'"
)
_OTHER = {
    ev.TERMINATE_WORKFLOW: _ENDED_FIRST,
    ev.PAUSE_WORKFLOW: _ENDED_FIRST,
    ev.RESUME_WORKFLOW: _ENDED_FIRST,
    ev.RESTART_WORKFLOW: " (or, when a task fails again at once,\n"
    "'restarted (now failed again: <error>)')",
    ev.DELETE_WORKFLOW: "",
}

# What a control leads to, as printed when it got there.
_DONE = {
    ev.TERMINATE_WORKFLOW: rec.TERMINATED,
    ev.PAUSE_WORKFLOW: rec.PAUSED_STATE,
    ev.RESUME_WORKFLOW: rec.RUNNING,
    ev.RESTART_WORKFLOW: rec.RUNNING,
    ev.DELETE_WORKFLOW: "deleted",
}
_PAST = {
    ev.TERMINATE_WORKFLOW: "terminated",
    ev.PAUSE_WORKFLOW: "paused",
    ev.RESUME_WORKFLOW: "resumed",
    ev.RESTART_WORKFLOW: "restarted",
    ev.DELETE_WORKFLOW: "deleted",
}


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    for kind in ev.CONTROLS:
        name = _verb(kind)
        states = ACTS_ON[kind]
        parser = commands.add_parser(
            name,
            parents=[common],
            help=_HELP[kind],
            description=textwrap.fill(_WHAT[kind], 88),
            epilog=_HOW.format(
                done=_DONE[kind], verb=name, other=_OTHER[kind].format(verb=name, done=_DONE[kind])
            ),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument("ids", nargs="*", metavar="ID", help="workflow ids")
        parser.add_argument(
            "--state",
            action="append",
            choices=states,
            help="only workflows in this state"
            + (f"; give it twice for both ({' and '.join(states)})" if len(states) > 1 else ""),
        )
        parser.add_argument("--flow", help="only workflows of this flow name")
        if kind == ev.TERMINATE_WORKFLOW:
            parser.add_argument(
                "--reason",
                default=DEFAULT_REASON,
                help=f"recorded as the workflow's error (default {DEFAULT_REASON!r})",
            )
        parser.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT,
            metavar="SECONDS",
            help="for ids: how long to wait, for all of them together, for a lifecycle worker "
            f"to apply it (default {DEFAULT_TIMEOUT:g}); filters alone never wait",
        )
        parser.add_argument(
            "--no-wait", action="store_true", help="send the events and return at once"
        )
        parser.set_defaults(func=_command(kind))


def _command(kind: str) -> Any:
    def run(args: argparse.Namespace, context: Context) -> int:
        if args.timeout < 0:
            raise CliError(f"--timeout {args.timeout:g}: expected 0 or more seconds")
        selection = Selection(tuple(args.state) if args.state else None, args.flow)
        if not args.ids and not selection.states and selection.flow is None:
            raise CliError("give workflow ids, or select workflows with --state or --flow")
        reason = getattr(args, "reason", "")
        if args.ids:
            wait = 0.0 if args.no_wait else args.timeout
            return max(
                _ids(_client(context, index), kind, ids, selection, reason, wait)
                for index, ids in context.partitions.group(args.ids).items()
            )
        return max(
            _filtered(_client(context, index), kind, selection, reason)
            for index in range(context.partitions.count)
        )

    return run


def _client(context: Context, index: int) -> Client:
    keys = context.partitions.keys(index)
    return Client(context.client_for(keys), keys)


def _ids(
    client: Client,
    kind: str,
    ids: list[str],
    selection: Selection,
    reason: str,
    wait: float,
) -> int:
    """Act on each id the filters match; one line per id; the worst exit code."""
    unique = list(dict.fromkeys(ids))  # an id given twice is one workflow
    targets: list[WorkflowStatus] = []
    lines: dict[str, tuple[str, int]] = {}
    for workflow_id, status in zip(unique, client.statuses(unique), strict=True):
        if status is None:
            error = no_workflow(client.redis, client.keys, workflow_id)
            lines[workflow_id] = (f"error: {error}", EXIT_USAGE)
        elif not selection.matches(status):
            lines[workflow_id] = (f"workflow {workflow_id}: {_unmatched(status, selection)}", 0)
        else:
            targets.append(status)
    for applied in client.apply(kind, targets, reason, wait):
        text, code = describe(kind, applied, wait)
        lines[applied.workflow] = (f"workflow {applied.workflow}: {text}", code)
    for text, code in (lines[w] for w in unique):
        print(text, file=sys.stderr if code else sys.stdout, flush=True)
    return max((code for _, code in lines.values()), default=EXIT_OK)


def describe(kind: str, applied: Applied, wait: float) -> tuple[str, int]:
    """What became of one workflow's action, as a line (after ``workflow ID: ``), and its
    exit code."""
    verb = _verb(kind)
    if applied.refused is not None:
        return f"not allowed: {applied.refused}", EXIT_FAILED
    if applied.event_id is None:
        return f"already {applied.state}", EXIT_OK
    if wait <= 0:
        return f"{verb} sent (event {applied.event_id})", EXIT_OK
    if applied.state is None:
        return (
            f"{verb} sent (event {applied.event_id}) but not applied within {wait:g}s: "
            "is a lifecycle worker running? (python -m lifecycle status)"
        ), EXIT_FAILED
    if applied.overtaken:
        error = f": {applied.error}" if applied.error else ""
        return (
            f"{applied.state} before the {verb} reached it (not {_PAST[kind]}){error}",
            EXIT_FAILED,
        )
    if applied.state == _DONE[kind]:
        return applied.state, EXIT_OK
    again = " again" if applied.state == applied.before else ""
    return f"{_PAST[kind]} (now {_now(applied, again)})", EXIT_OK


def _now(applied: Applied, again: str = "") -> str:
    """The state it is in now, with its error when it has one."""
    error = f": {applied.error}" if applied.error and applied.state in rec.ENDED_STATES else ""
    return f"{applied.state}{again}{error}"


def _unmatched(status: WorkflowStatus, selection: Selection) -> str:
    if selection.states and status.state not in selection.states:
        return f"not in state {' or '.join(selection.states)} (it is {status.state}), skipped"
    return f"not of flow {selection.flow} (it is of {status.flow or 'no named flow'}), skipped"


def _filtered(client: Client, kind: str, selection: Selection, reason: str) -> int:
    """Send to every workflow the filters select; one summary line, and on stderr the
    reasons some were not allowed (with a few of their ids)."""
    outcomes = client.apply(kind, list(client.select(selection)), reason)
    sent = sum(1 for o in outcomes if o.event_id is not None)
    already = Counter(o.state for o in outcomes if o.event_id is None and o.refused is None)
    refused: dict[str, list[str]] = {}
    for o in outcomes:
        if o.refused is not None:
            refused.setdefault(o.refused, []).append(o.workflow)
    parts = [f"{_verb(kind)}: {sent:,} sent"]
    if not outcomes:
        parts.append(f"no workflow matched {_filters(selection)}")
    parts += [f"{n:,} matched but already {state}" for state, n in already.items()]
    not_allowed = sum(len(ids) for ids in refused.values())
    if not_allowed:
        parts.append(f"{not_allowed:,} matched but not allowed")
    print("; ".join(parts), flush=True)
    for why, ids in refused.items():
        shown = ", ".join(ids[:_EXAMPLES_SHOWN]) + (", ..." if len(ids) > _EXAMPLES_SHOWN else "")
        print(f"  {len(ids):,} not allowed: {why} ({shown})", file=sys.stderr)
    return EXIT_OK


def _filters(selection: Selection) -> str:
    given = [f"--state {state}" for state in selection.states]
    if selection.flow is not None:
        given.append(f"--flow {selection.flow}")
    return " ".join(given)


def _verb(kind: str) -> str:
    return kind.removesuffix("-workflow")
