"""``python -m lifecycle run``: start a workflow and, with ``--wait``, follow it to its end."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import orjson
import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from flowlang.graph import Graph, NodeKind
from lifecycle import compact
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.cli.stalls import DEFAULT_WARN_AFTER, StallWatch
from lifecycle.cli.support import (
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    Context,
    compile_file,
    print_json,
    read_input,
)
from lifecycle.errors import NotAllowed
from lifecycle.keys import Keys
from lifecycle.partitions import check_unchanged
from lifecycle.priorities import MAX_PRIORITY, MIN_PRIORITY, BadPriority, check_priority
from lifecycle.submit import (
    BadConcurrency,
    check_concurrency,
    new_workflow_id,
    start_workflow,
    start_workflow_once,
)
from rqse.keys import dead_letter_key

__all__ = [
    "DEAD_LETTERED",
    "Ending",
    "Since",
    "add_commands",
    "last_id",
    "wait_for_end",
    "workflow_state",
]


IF_EXISTS = ("return", "fail")

RUN_EXIT_CODES = """\
exit codes: 0 started (with --wait: the workflow finished; its output is printed);
1 with --wait: the workflow failed or was terminated, or the engine refused its start
(it never existed), or waiting was interrupted (Ctrl-C: the workflow goes on); also
--if-exists fail for an id that exists; 2 bad arguments, a bad flow or input, an --id
that exists (without --if-exists), Redis unreachable, or --timeout passed before the end
(the workflow goes on: python -m lifecycle inspect ID).
"""


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    run = commands.add_parser(
        "run",
        parents=[common],
        help="start a workflow from a .flow file",
        description="Start a workflow from a .flow file: print its id and return, or with "
        "--wait follow it to its end and print its output.",
        epilog=RUN_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("file", help="the .flow file ('-' for stdin)")
    run.add_argument("--input", help="workflow input: JSON text, or @file.json")
    run.add_argument(
        "--id",
        help="workflow id (default: <flow name>-<uuid>, or workflow-<uuid> for a flow "
        "without @flow name, e.g. from stdin)",
    )
    run.add_argument(
        "--wait",
        action="store_true",
        help="wait for the end: print the output (finished), or the error on stderr",
    )
    run.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="with --wait: stop waiting after this many seconds and exit 2; the workflow "
        "goes on (default: wait until it ends)",
    )
    run.add_argument(
        "--if-exists",
        choices=IF_EXISTS,
        help="when --id names a workflow that exists: 'return' treats it as the one started "
        "(its id; with --wait, its result), 'fail' exits 1; without it: exit 2",
    )
    run.add_argument(
        "--priority",
        default="0",
        metavar="N",
        help=f"an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, default 0: a kind's workers "
        "start the tasks of higher-priority workflows first (docs/operations.md, Priorities)",
    )
    run.add_argument(
        "--warn-after",
        type=float,
        default=DEFAULT_WARN_AFTER,
        metavar="SECONDS",
        help="with --wait: say once on stderr what the workflow waits for (no lifecycle "
        f"worker, no worker for a kind) after this long without progress, default "
        f"{DEFAULT_WARN_AFTER:g}; 0: never",
    )
    run.add_argument(
        "--concurrency-key",
        metavar="KEY",
        help="with --max-running: at most N workflows of KEY run at once; this one waits "
        "queued until a place is free (in the order they were sent)",
    )
    run.add_argument("--max-running", type=int, metavar="N", help="see --concurrency-key")
    run.set_defaults(func=_run)


def workflow_state(client: redis.Redis, keys: Keys, workflow_id: str) -> str | None:
    """The state ``inspect`` shows for an existing workflow, as
    :meth:`lifecycle.client.Client.status` reads it (``paused`` while a running one's
    record holds the paused field); None when its record does not exist."""
    # HGET alone: the documented ACL of `run` (docs/security.md) grants no HMGET.
    key = keys.workflow(workflow_id)
    pipe = client.pipeline(transaction=False)
    for field in (rec.STATE, rec.PAUSED, rec.VERSION, rec.CONCURRENCY):
        pipe.hget(key, field)
    raw, paused, version, concurrency = pipe.execute()
    if raw is None and version is None:
        found = compact.read_compacted(client, keys, [workflow_id])[0]
        if found is None:
            return None
        raw = found.get(rec.STATE.encode())
    state = _loads(raw)
    if not isinstance(state, dict) or not isinstance(state.get("status", rec.RUNNING), str):
        return "corrupt"
    status = str(state.get("status", rec.RUNNING))
    return rec.shown_state(status, paused is not None, rec.is_queued(concurrency))


def _exists(args: argparse.Namespace, context: Context) -> bool:
    """Whether ``--id`` names a workflow that exists and ``--if-exists return`` says to
    take it as the one started; raises (exit 2, or 1 for ``fail``) when it exists
    otherwise."""
    if args.id is None:
        return False
    state = workflow_state(*context.for_workflow(args.id), args.id)
    if state is None:
        return False
    return _taken(args, state)


def _taken(args: argparse.Namespace, state: str) -> bool:
    """``--id`` is taken by a workflow in ``state``: True for ``--if-exists return``,
    else the refusal (exit 2, or 1 for ``fail``)."""
    if args.if_exists == "fail":
        raise NotAllowed(f"workflow {args.id} exists (state {state})")
    if args.if_exists is None:
        raise CliError(f"workflow {args.id} exists (state {state}); --if-exists return|fail")
    return True


def _priority(text: str) -> int:
    """The ``--priority`` value; CliError (one line, exit 2) when it is no integer in range."""
    try:
        value = int(text)
    except ValueError:
        raise CliError(f"--priority: {text!r} is not an integer") from None
    try:
        return check_priority(value, "--priority")
    except BadPriority as error:
        raise CliError(str(error)) from None


def _run(args: argparse.Namespace, context: Context) -> int:
    priority = _priority(args.priority)
    graph = compile_file(args.file)
    value = read_input(args.input)
    client, keys = context.client, context.keys
    # Checked before the start: the engine would take a second start of the same id as
    # the first one's redelivery and say nothing.
    if args.id is not None and not args.id.strip():
        raise CliError("--id must name the workflow: it is empty")
    gate = {"concurrency_key": args.concurrency_key, "max_running": args.max_running}
    try:
        check_concurrency(**gate)
    except BadConcurrency as error:
        raise CliError(f"--concurrency-key/--max-running: {error}") from error
    partitions = context.partitions
    chosen = args.id
    if chosen is None and partitions.count > 1:  # the id says the partition: chosen here
        chosen = partitions.place(new_workflow_id(graph), args.concurrency_key)
    elif chosen is not None:
        partitions.check_placed(chosen, args.concurrency_key)
    if chosen is not None:
        client, keys = context.for_workflow(chosen)
    exists = _exists(args, context)
    since = Since.now(client, keys) if args.wait else None
    if exists:
        workflow_id = args.id
    elif args.id is not None:  # the id is claimed and started in one step
        if not start_workflow_once(client, graph, value, args.id, keys, priority=priority, **gate):
            exists = _taken(args, "starting: its start is not applied yet")
        workflow_id = args.id
    else:
        workflow_id = start_workflow(client, graph, value, chosen, keys, priority=priority, **gate)
    check_unchanged(context.client, partitions)
    if since is None:  # a submitter need not read the lifecycle stream (docs/security.md)
        print(workflow_id)
        return EXIT_OK
    try:
        print(workflow_id, flush=True)
        console = Console(stderr=True)
        watch = StallWatch(client, keys, graph, args.warn_after)
        ending = wait_for_end(client, keys, workflow_id, graph, since, args.timeout, console, watch)
    except KeyboardInterrupt:  # the workflow is the engine's: it goes on without us
        print(
            f"stopped waiting; workflow {workflow_id} goes on "
            f"(python -m lifecycle inspect {workflow_id})",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if ending is None:
        print(
            f"error: workflow {workflow_id} did not end within {args.timeout:g}s", file=sys.stderr
        )
        return EXIT_ERROR
    if ending.status == rec.FINISHED:
        print_json(ending.output)
        return EXIT_OK
    print(f"workflow {workflow_id} {ending.status}: {ending.reason}", file=sys.stderr)
    return EXIT_FAILED


@dataclass(frozen=True)
class Ending:
    """How a workflow ended: ``status`` finished, failed, terminated, or ``dead-lettered``
    when the lifecycle refused its start-workflow (the workflow never existed)."""

    status: str
    output: Any = None
    reason: str | None = None


DEAD_LETTERED = "dead-lettered"


@dataclass(frozen=True)
class Since:
    """The last entry ids of the lifecycle stream and its dead letters before a start:
    where following the workflow begins."""

    lifecycle: str
    dead: str

    @classmethod
    def now(cls, client: redis.Redis, keys: Keys) -> Since:
        return cls(
            last_id(client, keys.lifecycle), last_id(client, dead_letter_key(keys.lifecycle))
        )


def last_id(client: redis.Redis, stream: str) -> str:
    last: Any = client.xrevrange(stream, count=1)
    return str(last[0][0].decode()) if last else "0-0"


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
    since: Since,
    timeout: float | None,
    console: Console,
    watch: StallWatch | None = None,
) -> Ending | None:
    """Follow the lifecycle stream and its dead letters from ``since`` until the workflow
    ends or its start-workflow is dead-lettered, showing ended/started tasks; None on
    timeout. ``watch``'s warnings go to ``console`` as they come."""
    deadline = None if timeout is None else time.monotonic() + timeout
    dead = dead_letter_key(keys.lifecycle)
    cursors = {keys.lifecycle: since.lifecycle, dead: since.dead}
    workflow_key = keys.workflow(workflow_id)
    needle = orjson.dumps(workflow_id)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    # Off the terminal (a pipe, a log) the bar would leave only an empty line behind.
    shows_bar = console.is_terminal
    with Progress(*columns, console=console, transient=True, disable=not shows_bar) as progress:
        bar = progress.add_task(workflow_id[:40], total=_task_total(graph))
        while deadline is None or time.monotonic() < deadline:
            reply: Any = client.xread(cursors, count=500, block=200)  # type: ignore[arg-type]
            for stream, entries in reply or []:
                name = stream.decode()
                for entry_id, fields in entries:
                    cursors[name] = entry_id.decode()
                    if name == dead:
                        ending = _dead_letter_ending(fields, needle)
                    elif fields.get(b"workflow") == needle:
                        ending = _event_ending(fields)
                    else:
                        ending = None
                    if ending is not None:
                        return ending
            names: list[bytes] = client.hkeys(workflow_key)  # type: ignore[assignment]
            started = sum(1 for n in names if n.startswith(rec.START_PREFIX.encode()))
            ended = sum(1 for n in names if n.startswith(rec.END_PREFIX.encode()))
            progress.update(bar, completed=ended, total=max(started, _task_total(graph), 1))
            for line in watch.check(names) if watch is not None else ():
                console.print(line, markup=False, highlight=False, soft_wrap=True)
            final = _ending_from_record(client, keys, workflow_id)
            if final is not None:  # the end event was trimmed away before we read it
                return final
    return None


def _loads(raw: bytes | None) -> Any:
    try:
        return orjson.loads(raw) if raw is not None else None
    except orjson.JSONDecodeError:
        return None


def _event_ending(fields: dict[bytes, bytes]) -> Ending | None:
    kind = _loads(fields.get(b"kind"))
    if kind == ev.END_WORKFLOW:
        return Ending(rec.FINISHED, output=_loads(fields.get(b"output")))
    if kind == ev.FAILED_WORKFLOW:
        status = _loads(fields.get(b"status"))
        reason = _loads(fields.get(b"reason"))
        return Ending(
            status if isinstance(status, str) else rec.FAILED, reason=_text(reason, "failed")
        )
    return None


def _dead_letter_ending(fields: dict[bytes, bytes], needle: bytes) -> Ending | None:
    """The ending of a dead letter that holds this workflow's start-workflow."""
    original = _loads(fields.get(b"fields"))
    if not isinstance(original, dict) or original.get("workflow") != needle.decode():
        return None
    if _loads(str(original.get("kind", "null")).encode()) != ev.START_WORKFLOW:
        return None
    reason, error = _loads(fields.get(b"reason")), _loads(fields.get(b"error"))
    what = _text(error, "") or _text(reason, "no reason given")
    return Ending(DEAD_LETTERED, reason=f"its start-workflow was dead-lettered: {what}")


def _text(value: Any, default: str) -> str:
    return value if isinstance(value, str) and value else default


def _ending_from_record(client: redis.Redis, keys: Keys, workflow_id: str) -> Ending | None:
    raw: Any = client.hget(keys.workflow(workflow_id), rec.STATE)
    if raw is None:
        found = compact.read_compacted(client, keys, [workflow_id])[0]
        raw = found.get(rec.STATE.encode()) if found is not None else None
    state = _loads(raw)
    if not isinstance(state, dict):
        return None
    status = state.get("status")
    if status == rec.FINISHED:
        return Ending(rec.FINISHED, output=state.get("output"))
    if status in (rec.FAILED, rec.TERMINATED):
        return Ending(status, reason=_text(state.get("error"), str(status)))
    return None
