"""``python -m lifecycle receipts | replay | recover``: the audit commands.

Exit codes: 0 ok; 1 replay found a difference (chain broken, or a workflow
diverged from its archive or its live record), or recover left a lost workflow
it could not restore; 2 error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import redis

from flowlang.limits import Limits, limits_with
from lifecycle.cli.support import (
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    Context,
    at_least_one,
    dumps_text,
    print_json,
    watch_partition_count,
)
from lifecycle.cli.worker import LIMIT_NAMES, limits_arguments, limits_from
from lifecycle.keys import Keys
from lifecycle.partitions import Partitions, archived_partitions
from rqse.errors import RqseError
from rqse.metrics import metrics_arguments

if TYPE_CHECKING:
    from lifecycle.audit.receipts import ReceiptsStats, ReceiptsWorker
    from lifecycle.audit.segments import SegmentSink
    from lifecycle.metrics import ProcessMetrics

__all__ = ["EXIT_DIFFERENT", "add_commands"]

log = logging.getLogger(__name__)

EXIT_DIFFERENT = EXIT_FAILED  # replay found a difference


def _seconds(text: str) -> float:
    """A duration in seconds, above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} seconds: expected more than 0 and finite")
    return value


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``receipts`` and ``replay`` to the lifecycle CLI's subparsers."""
    receipts = commands.add_parser(
        "receipts", parents=[common], help="archive every engine event (the receipts worker)"
    )
    receipts.add_argument("--archive", default="receipts", help="archive directory (./receipts)")
    receipts.add_argument("--consumer", default="receipts", help="consumer name (keep it stable)")
    receipts.add_argument("--batch-size", type=at_least_one, default=1000, help="entries per read")
    receipts.add_argument(
        "--segment-mb", type=float, default=64.0, help="rotate segments at this size (64)"
    )
    receipts.add_argument("--compress", action="store_true", help="gzip closed segments")
    receipts.add_argument(
        "--trim-interval", type=_seconds, default=1.0, help="seconds between trims (1)"
    )
    receipts.add_argument(
        "--trim-after",
        type=at_least_one,
        default=5000,
        help="also trim a stream once this many of its entries were archived (5000)",
    )
    receipts.add_argument("--no-trim", action="store_true", help="never trim the streams")
    receipts.add_argument(
        "--partition",
        type=int,
        action="append",
        metavar="I",
        help="archive only partition I (repeatable; default all): several receipts workers "
        "can divide a deployment's partitions, each partition archived by exactly one",
    )
    metrics_arguments(receipts)
    receipts.set_defaults(func=_receipts, narrates=True)

    replay = commands.add_parser(
        "replay", parents=[common], help="rebuild workflows from an archive and check them"
    )
    replay.add_argument("archive", help="archive directory")
    replay.add_argument("--workflow", help="only this workflow id")
    replay.add_argument("--json", action="store_true", help="print JSON")
    replay.add_argument("--offline", action="store_true", help="do not compare with Redis")
    limits_arguments(replay, _RECORDED)
    replay.set_defaults(func=_replay_command)

    recover = commands.add_parser(
        "recover",
        parents=[common],
        help="restore from the archive the workflows Redis lost (or holds at an older point)",
    )
    recover.add_argument("--archive", required=True, help="archive directory")
    recover.add_argument("--workflow", help="only this workflow id")
    recover.add_argument("--dry-run", action="store_true", help="say what would be restored")
    recover.add_argument("--json", action="store_true", help="print JSON")
    limits_arguments(recover, _RECORDED)
    recover.set_defaults(func=_recover)


def _replay_command(args: argparse.Namespace, context: Context) -> int:
    if not Path(args.archive).is_dir():  # said before anything about Redis
        raise CliError(f"{args.archive}: no such archive directory")
    live: Context | None = None
    if not args.offline:
        try:
            context.client.ping()
            live = context
        except (redis.RedisError, RqseError) as error:
            log.warning(
                "not comparing with live data: cannot reach Redis at %s: %s", context.where, error
            )
    # The count: as given, else as stored, else from the archive's folders.
    count = args.partitions if live is None else context.partitions.count
    partitions = archived_partitions(args.archive, args.prefix, count)
    code = EXIT_OK
    try:
        for index, keys in _chosen(partitions, args.workflow):
            archive = partitions.archive(args.archive, index)
            if not archive.is_dir():  # another receipts worker's (--partition), elsewhere
                print(f"partition {index} ({keys.prefix}): no archive at {archive}")
                continue
            client = live.client_for(keys) if live is not None else None
            code = max(code, _replay(args, archive, client, keys))
    except ValueError as error:  # a graph record whose text does not parse
        raise CliError(f"{args.archive}: {error}") from None
    return code


def _chosen(partitions: Partitions, workflow: str | None) -> list[tuple[int, Keys]]:
    """The partitions to audit: the workflow's own, or all."""
    if workflow is not None:
        index = partitions.index_of(workflow)
        return [(index, partitions.keys(index))]
    return list(enumerate(partitions.all))


def _recover(args: argparse.Namespace, context: Context) -> int:
    code = EXIT_OK
    for index, keys in _chosen(context.partitions, args.workflow):
        archive = context.partitions.archive(args.archive, index)
        if not archive.is_dir():  # another receipts worker's (--partition), elsewhere
            print(f"partition {index} ({keys.prefix}): no archive at {archive}")
            continue
        code = max(code, _recover_partition(args, context.client_for(keys), keys, archive))
    return code


def _recover_partition(
    args: argparse.Namespace, client: redis.Redis, keys: Keys, archive: Path
) -> int:
    from lifecycle.audit.recover import recover

    try:
        report = recover(
            client,
            str(archive),
            keys,
            workflow=args.workflow,
            dry_run=args.dry_run,
            limits=replay_limits(args, client, keys),
        )
    except ValueError as error:  # a graph record whose text does not parse
        raise CliError(f"{archive}: {error}") from None
    if args.json:
        print_json({**report.summary(), "workflows": report.restored})
    else:
        verb = "would restore" if args.dry_run else "restored"
        for workflow in report.restored:
            print(f"{verb} {workflow}")
        for workflow, why in report.skipped:
            print(f"not restored {workflow}: {why}")
        print(
            f"{len(report.restored)} {verb}, {report.resent} start-tasks sent again, "
            f"{len(report.skipped)} not restored, {report.audit.replayed} workflows replayed"
        )
    return EXIT_FAILED if report.skipped else EXIT_OK


def _receipts(args: argparse.Namespace, context: Context) -> int:
    partitions = context.partitions
    if args.metrics_port is None:
        return _archive(args, context, partitions, None)
    from lifecycle.metrics import ProcessMetrics

    metrics = ProcessMetrics()
    for keys in partitions.all:  # first: it counts round trips
        metrics.round_trips.count(context.client_for(keys).connection_pool)
    metrics.serve(args.metrics_port, args.metrics_host)  # a port in use: before any file
    try:
        return _archive(args, context, partitions, metrics)
    finally:
        metrics.stop()


class _Archiving:
    """One partition's receipts worker and its sink, run like a listener (rqse.runner)."""

    def __init__(self, worker: ReceiptsWorker, sink: SegmentSink, consumer: str) -> None:
        self.worker, self.sink, self.consumer = worker, sink, consumer
        self.stats: ReceiptsStats | None = None

    def listen(self) -> None:
        try:
            self.stats = self.worker.run()
        finally:
            self.sink.close()

    def stop(self) -> None:
        self.worker.stop()


def _archive(
    args: argparse.Namespace,
    context: Context,
    partitions: Partitions,
    metrics: ProcessMetrics | None,
) -> int:
    from lifecycle.audit.receipts import ReceiptsWorker
    from lifecycle.audit.segments import SegmentSink
    from rqse.process import settle_process
    from rqse.runner import Runner

    chosen = sorted(set(args.partition)) if args.partition else range(partitions.count)
    for index in chosen:
        if not 0 <= index < partitions.count:
            raise CliError(
                f"--partition {index}: the deployment has partitions 0 to {partitions.count - 1}"
            )
    archiving = []
    for index in chosen:
        keys = partitions.keys(index)
        # A partition's archive directory is locked by its sink: one worker each.
        sink = SegmentSink(
            partitions.archive(args.archive, index),
            segment_bytes=int(args.segment_mb * (1 << 20)),
            compress=args.compress,
        )
        worker = ReceiptsWorker(
            context.client_for(keys),
            sink,
            keys,
            consumer=args.consumer,
            batch_size=args.batch_size,
            trim_every=None if args.no_trim else args.trim_interval,
            trim_after=args.trim_after,
        )
        if metrics is not None and partitions.count == 1:
            from lifecycle.metrics import ReceiptsCollector

            metrics.register(ReceiptsCollector(worker))
        archiving.append(_Archiving(worker, sink, args.consumer))
    settle_process()
    log.info(
        "receipts worker %s archiving %s into %s",
        args.consumer,
        ", ".join(f"{partitions.keys(index).prefix}*" for index in chosen),
        args.archive,
    )
    watch = watch_partition_count(context.client, partitions)
    if len(archiving) == 1:
        archiving[0].worker.install_signal_handlers()
        archiving[0].listen()
        code = EXIT_OK
    else:
        code = Runner(archiving).run()
    if watch is not None:
        watch.stop()
        if watch.changed:
            code = EXIT_FAILED
    for each in archiving:
        stats = each.stats
        if stats is None:
            continue
        log.info(
            "receipts: archived %d in %d batches, skipped %d already archived, trimmed %d; "
            "peak lengths %s",
            stats.archived,
            stats.batches,
            stats.skipped,
            stats.trimmed,
            stats.peak_lengths,
        )
    return code


_RECORDED = "default: as the lifecycle workers recorded in Redis, else"


def replay_limits(args: argparse.Namespace, client: redis.Redis | None, keys: Keys) -> Limits:
    """The limits to replay with: those the flags give, else those the lifecycle workers
    recorded in Redis (``Keys.limits``), else the defaults."""
    if any(getattr(args, f"limit_{name}", None) is not None for name in LIMIT_NAMES):
        return limits_from(args)
    raw = client.get(keys.limits) if client is not None else None
    try:
        recorded = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        log.warning("%s is not JSON: replaying with the default limits", keys.limits)
        recorded = {}
    return limits_with(recorded if isinstance(recorded, dict) else {})


def _replay(args: argparse.Namespace, archive: Path, client: redis.Redis | None, keys: Keys) -> int:
    from lifecycle.audit.report import audit_archive
    from lifecycle.history import format_timeline

    limits = replay_limits(args, client, keys)
    report = audit_archive(str(archive), keys, workflow=args.workflow, client=client, limits=limits)
    if args.workflow and not report.workflows:
        raise CliError(f"no workflow {args.workflow!r} in {args.archive}")
    if args.json:
        data = {**report.summary(), "replays": [w.summary() for w in report.workflows]}
        print_json(data)
    else:
        for finding in report.chain:
            print(f"TAMPERED: {finding}")
        for item in report.workflows:
            summary = item.summary()
            verdict = "equal" if item.divergence is None else "DIVERGED"
            print(
                f"workflow {item.workflow}: {summary['state']}, replay {verdict}, live {item.live}"
            )
            if summary["output"] is not None:
                print(f"  output: {dumps_text(summary['output'])}")
            if summary["error"]:
                print(f"  error: {summary['error']}")
            if item.divergence is not None:
                print(f"  first diverging event {item.divergence.event}: {item.divergence}")
            for line in format_timeline(summary["timeline"]):
                print(f"  {line}")
        totals = report.summary()
        workflows, chain = totals["workflows"], len(report.chain)
        print(
            f"{workflows} workflow{'' if workflows == 1 else 's'} replayed "
            f"({totals['records']} archive records read), {totals['diverged']} diverged, "
            f"{totals['lost_in_redis']} lost in Redis (python -m lifecycle recover), "
            f"{chain} chain problem{'' if chain == 1 else 's'}; head {report.head}"
        )
    problem = report.first_problem
    if problem is not None:
        print(f"difference: {problem}", file=sys.stderr)
    return EXIT_OK if report.ok else EXIT_DIFFERENT
