"""``python -m lifecycle receipts | replay | history``: the audit commands.

Plugged into :mod:`lifecycle.cli` by :func:`add_commands` and
:func:`run_command`. Exit codes: 0 ok; 1 replay found a difference (chain
broken, or a workflow diverged from its archive or its live record); 2 error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import orjson
import redis

from lifecycle.keys import Keys

__all__ = ["add_commands", "run_command"]

log = logging.getLogger(__name__)

EXIT_OK, EXIT_DIFFERENT, EXIT_ERROR = 0, 1, 2


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``receipts``, ``replay`` and ``history`` to the lifecycle CLI's subparsers."""
    receipts = commands.add_parser(
        "receipts", parents=[common], help="archive every engine event (the receipts worker)"
    )
    receipts.add_argument("--archive", default="receipts", help="archive directory (./receipts)")
    receipts.add_argument("--consumer", default="receipts", help="consumer name (keep it stable)")
    receipts.add_argument("--batch-size", type=int, default=1000, help="entries per read")
    receipts.add_argument(
        "--segment-mb", type=float, default=64.0, help="rotate segments at this size (64)"
    )
    receipts.add_argument("--compress", action="store_true", help="gzip closed segments")
    receipts.add_argument(
        "--trim-interval", type=float, default=1.0, help="seconds between trims (1)"
    )
    receipts.add_argument("--no-trim", action="store_true", help="never trim the streams")

    replay = commands.add_parser(
        "replay", parents=[common], help="rebuild workflows from an archive and check them"
    )
    replay.add_argument("archive", help="archive directory")
    replay.add_argument("--workflow", help="only this workflow id")
    replay.add_argument("--json", action="store_true", help="print JSON")
    replay.add_argument("--offline", action="store_true", help="do not compare with Redis")

    history = commands.add_parser("history", parents=[common], help="one workflow's timeline")
    history.add_argument("id")
    history.add_argument("--json", action="store_true", help="print JSON")


def run_command(args: argparse.Namespace, keys: Keys) -> int | None:
    """Run an audit command; None when ``args.command`` is not one of them."""
    if args.command not in ("receipts", "replay", "history"):
        return None
    from lifecycle.archive import ArchiveError
    from lifecycle.cli import CliError, connect
    from lifecycle.errors import LifecycleError

    try:
        if args.command == "receipts":
            return _receipts(args, connect(args.redis_url), keys)
        if args.command == "replay":
            client = None
            if not args.offline:
                try:
                    client = connect(args.redis_url)
                except CliError as error:
                    log.warning("not comparing with live data: %s", error)
            return _replay(args, client, keys)
        return _history(args, connect(args.redis_url), keys)
    except (ArchiveError, LifecycleError, CliError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except redis.RedisError as error:
        print(f"error: Redis: {error}", file=sys.stderr)
        return EXIT_ERROR
    except (OSError, ValueError) as error:  # unreadable segment, bad graph text
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_ERROR


def _receipts(args: argparse.Namespace, client: redis.Redis, keys: Keys) -> int:
    from lifecycle.archive import SegmentSink
    from lifecycle.receipts import ReceiptsWorker
    from rqse.process import settle_process

    logging.getLogger().setLevel(logging.DEBUG if args.verbose else logging.INFO)
    sink = SegmentSink(
        args.archive, segment_bytes=int(args.segment_mb * (1 << 20)), compress=args.compress
    )
    worker = ReceiptsWorker(
        client,
        sink,
        keys,
        consumer=args.consumer,
        batch_size=args.batch_size,
        trim_every=None if args.no_trim else args.trim_interval,
    )
    worker.install_signal_handlers()
    settle_process()
    log.info("receipts worker %s archiving %s* into %s", args.consumer, keys.prefix, args.archive)
    try:
        stats = worker.run()
    finally:
        sink.close()
    log.info(
        "receipts: archived %d in %d batches, skipped %d already archived, trimmed %d; "
        "peak lengths %s",
        stats.archived,
        stats.batches,
        stats.skipped,
        stats.trimmed,
        stats.peak_lengths,
    )
    return EXIT_OK


def _replay(args: argparse.Namespace, client: redis.Redis | None, keys: Keys) -> int:
    from lifecycle.audit import audit_archive
    from lifecycle.history import format_timeline

    report = audit_archive(args.archive, keys, workflow=args.workflow, client=client)
    if args.workflow and not report.workflows:
        print(f"error: no workflow {args.workflow!r} in {args.archive}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        data = {**report.summary(), "replays": [w.summary() for w in report.workflows]}
        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
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
                print(f"  output: {orjson.dumps(summary['output']).decode()}")
            if summary["error"]:
                print(f"  error: {summary['error']}")
            if item.divergence is not None:
                print(f"  first diverging event {item.divergence.event}: {item.divergence}")
            for line in format_timeline(summary["timeline"]):
                print(f"  {line}")
        totals = report.summary()
        print(
            f"{totals['workflows']} workflows, {totals['records']} records, "
            f"{totals['diverged']} diverged, {len(report.chain)} chain problems; "
            f"head {report.head}"
        )
    problem = report.first_problem
    if problem is not None:
        print(f"difference: {problem}", file=sys.stderr)
    return EXIT_OK if report.ok else EXIT_DIFFERENT


def _history(args: argparse.Namespace, client: redis.Redis, keys: Keys) -> int:
    from lifecycle.history import format_timeline, live_history

    data = live_history(client, keys, args.id)
    if args.json:
        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
        return EXIT_OK
    print(f"workflow {args.id}: {data['state']}")
    if data["output"] is not None:
        print(f"  output: {orjson.dumps(data['output']).decode()}")
    if data["error"]:
        print(f"  error: {data['error']}")
    if not data["complete"]:
        print("  (streams trimmed: earlier events are only in the archive; use replay)")
    for line in format_timeline(data["timeline"]):
        print(f"  {line}")
    return EXIT_OK
