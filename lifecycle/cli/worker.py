"""``python -m lifecycle worker``: the lifecycle worker, and whatever runs beside it.

The engine knows no task worker; a composition that wants some served in the
same process (``wait:`` by default, in ``flowstream.worker``) passes them as
:class:`Companion` objects to :func:`worker_command`: each adds its options
and, unless switched off, starts before the lifecycle worker listens and stops
after it.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from flowlang.limits import DEFAULT_LIMITS, Limits
from lifecycle.cli.support import (
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    Context,
    Registrar,
    watch_partition_count,
)
from lifecycle.engine.retention import DEFAULT_KEEP_DETAILS, DEFAULT_RETENTION, parse_duration
from lifecycle.errors import LifecycleError
from lifecycle.keys import Keys
from rqse.metrics import metrics_arguments

__all__ = ["Companion", "Running", "worker_command"]

log = logging.getLogger(__name__)


class Running(Protocol):
    """A companion started in the background."""

    def stop(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


class Companion(Protocol):
    """Something the worker command runs beside the lifecycle worker."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add this companion's options (e.g. ``--no-wait``) to the worker's parser."""

    def start(self, args: argparse.Namespace, pool: Any, keys: Keys) -> Running | None:
        """Start in the background; None when ``args`` switch it off."""


def worker_command(companions: Sequence[Companion] = ()) -> Registrar:
    """The registrar of ``worker``, with ``companions`` run beside the lifecycle worker."""

    def add(commands: Any, common: argparse.ArgumentParser) -> None:
        worker = commands.add_parser("worker", parents=[common], help="run a lifecycle worker")
        worker.add_argument("--consumer", help="stable consumer name (default: host-pid-random)")
        worker.add_argument(
            "--no-timers", action="store_true", help="do not fire retry/timeout timers"
        )
        worker.add_argument(
            "--claim-idle",
            type=float,
            default=10.0,
            help="seconds before taking over a dead worker's events (default 10)",
        )
        worker.add_argument(
            "--batch-size", type=int, default=200, help="events per read (default 200)"
        )
        worker.add_argument(
            "--accept-untokened-answers",
            action="store_true",
            help="take end-tasks that carry no attempt token (task workers written for the "
            "predecessor system); a wrong token is refused all the same",
        )
        worker.add_argument(
            "--pack-starts",
            nargs="?",
            const="*",
            default=None,
            metavar="KINDS",
            help="send the start-tasks of one batch to a kind's stream as one start-tasks "
            "entry: for fast kinds whose workers all read packs (this version's "
            "TaskListener and noop/simulate do); KINDS: comma-separated (default: every "
            "kind but the built-in wait and resource)",
        )
        worker.add_argument(
            "--retain",
            default=DEFAULT_RETENTION,
            metavar="DURATION",
            help="how long a workflow that ended stays in Redis before it is removed (its "
            "history stays in the archive): 30s, 12h, 7d ... (default 7d; 0 keeps forever)",
        )
        worker.add_argument(
            "--keep-details",
            default=DEFAULT_KEEP_DETAILS,
            metavar="DURATION",
            help="how long a workflow that finished keeps its task records in Redis before "
            "they are compacted away (the archive keeps them; `history` shows them): 0 at "
            f"once, 30s, 1h ... (default {DEFAULT_KEEP_DETAILS})",
        )
        limits_arguments(worker)
        metrics_arguments(worker)
        worker.add_argument(
            "--no-metrics-status",
            action="store_true",
            help="leave stream lag, dead letters and workflows by state out of this "
            "worker's metrics (served by another lifecycle worker, or the API)",
        )
        for companion in companions:
            companion.add_arguments(worker)

        def run(args: argparse.Namespace, context: Context) -> int:
            return _worker(args, context, companions)

        worker.set_defaults(func=run, narrates=True)

    return add


_LIMIT_FLAGS = (  # flag, Limits field, what it bounds
    ("--max-value-bytes", "value_bytes", "bytes of one value: an input, a task output"),
    ("--max-depth", "depth", "nesting of arrays and objects in one value"),
    ("--max-items", "items", "items one iteration (*) fans out to"),
    ("--iteration-window", "window", "items of one iteration running at once"),
    ("--max-visits", "visits", "visits of nodes on a cycle in one advance"),
    ("--guard-ms", "guard_ms", "milliseconds one guard may take"),
    ("--max-task-starts", "task_starts", "tasks one workflow may start (default: no limit)"),
)


LIMIT_NAMES = tuple(name for _, name, _ in _LIMIT_FLAGS)


def limits_arguments(parser: argparse.ArgumentParser, default_from: str = "default") -> None:
    """The flags that change the lifecycle's limits (flowlang.limits.Limits);
    ``default_from`` says where a limit comes from when its flag is not given."""
    for flag, name, what in _LIMIT_FLAGS:
        default = getattr(DEFAULT_LIMITS, name)
        shown = f" ({default_from} {default:,})" if default is not None else ""
        parser.add_argument(flag, type=int, metavar="N", dest=f"limit_{name}", help=what + shown)


def limits_from(args: argparse.Namespace) -> Limits:
    """The limits the flags ask for; a value below 1 is a usage error."""
    changes = {}
    for flag, name, _ in _LIMIT_FLAGS:
        value = getattr(args, f"limit_{name}", None)
        if value is None:
            continue
        if value < 1:
            raise CliError(f"{flag} must be at least 1, got {value}")
        changes[name] = value
    return replace(DEFAULT_LIMITS, **changes)


def pack_starts_from(text: str | None) -> bool | frozenset[str]:
    """``--pack-starts``: False when absent, True for every kind, else the kinds named."""
    from lifecycle.engine.advance import pack_kinds

    if text is None:
        return False
    if text == "*":
        return True
    kinds = frozenset(kind.strip() for kind in text.split(",") if kind.strip())
    if not kinds:
        raise CliError("--pack-starts: name at least one kind, or none for every kind")
    try:
        pack_kinds(kinds)
    except ValueError as error:
        raise CliError(f"--pack-starts: {error}") from None
    return kinds


def duration_from(flag: str, text: str) -> float:
    try:
        return parse_duration(text)
    except LifecycleError as error:
        raise CliError(f"{flag}: {error}") from None


def _worker(args: argparse.Namespace, context: Context, companions: Sequence[Companion]) -> int:
    from lifecycle.partitions import stored_partitions
    from lifecycle.worker import LifecycleWorker
    from rqse.process import settle_process
    from rqse.runner import Runner

    # Bad values are reported before connecting.
    retain = duration_from("--retain", args.retain)
    pack_starts = pack_starts_from(args.pack_starts)
    keep_details = duration_from("--keep-details", args.keep_details)
    # The first worker of a deployment stores its partition count; the others must agree.
    partitions = stored_partitions(context.client, args.prefix, args.partitions, create=True)
    metrics = None
    if args.metrics_port is not None:
        from lifecycle.metrics import PartitionsCollector, ProcessMetrics, StatusCollector

        # Before the workers are built: round trips are counted by the pool's connections.
        metrics = ProcessMetrics(context.client.connection_pool)
        if args.no_metrics_status:
            pass
        elif partitions.count == 1:
            metrics.register(StatusCollector(context.client, context.keys))
        else:  # each sample labelled with its partition
            metrics.register(PartitionsCollector(context.each_partition()))
    workers = []
    for keys in partitions.all:
        pool = context.client_for(keys).connection_pool
        if metrics is not None:
            metrics.round_trips.count(pool)  # each partition's master has its own pool
        worker = LifecycleWorker(
            keys,
            timers=not args.no_timers,
            untokened_answers=args.accept_untokened_answers,
            pack_starts=pack_starts,
            limits=limits_from(args),
            retain=retain,
            keep_details=keep_details,
            consumer=args.consumer,
            pool=pool,
            claim_idle=args.claim_idle,
            batch_size=args.batch_size,
            handle_signals=partitions.count == 1,
        )
        workers.append(worker)
        if metrics is not None:
            metrics.watch(worker)
            if worker.dead_tasks is not None:
                metrics.watch(worker.dead_tasks.listener)
            worker.advance_seconds = metrics.advance_seconds()
    if metrics is not None:
        metrics.serve(args.metrics_port, args.metrics_host)
    log.info(
        "lifecycle worker %s listening on %s",
        workers[0].consumer,
        ", ".join(worker.keys.lifecycle for worker in workers),
    )
    running: list[Running] = []
    try:
        for keys in partitions.all:
            for companion in companions:
                started = companion.start(args, context.client_for(keys).connection_pool, keys)
                if started is not None:
                    running.append(started)
                    if metrics is not None:
                        for listener in getattr(started, "listeners", ()):
                            metrics.watch(listener)
        settle_process()
        watch = watch_partition_count(context.client, partitions)
        if len(workers) == 1:
            workers[0].listen()
            code = EXIT_OK
        else:
            # One thread per partition; a signal drains them all.
            code = Runner(workers).run()
        if watch is not None:
            watch.stop()
            if watch.changed:
                code = EXIT_FAILED
    finally:
        if metrics is not None:
            metrics.stop()
        # Companions keep their state in Redis: stopping them loses nothing registered.
        for started in running:
            started.stop()
        for started in running:
            started.join(10)
    return code
