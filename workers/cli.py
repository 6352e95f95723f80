"""``python -m workers``: run task workers — your own, the built-in ones, the simulators."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from lifecycle.cli.support import partitions_argument, watch_partition_count
from lifecycle.errors import LifecycleError
from lifecycle.keys import Keys
from lifecycle.partitions import stored_partitions
from rqse.cluster import Connections
from rqse.connection import redis_arguments, resolve_url
from rqse.errors import RqseError
from rqse.metrics import metrics_arguments
from rqse.process import settle_process
from rqse.runner import Runner
from workers.errors import WorkerError

if TYPE_CHECKING:
    from lifecycle.metrics import ProcessMetrics

__all__ = ["main"]

log = logging.getLogger(__name__)

EXIT_OK = 0  # stopped cleanly (signal, or every listener returned)
EXIT_STOPPED_BADLY = 1  # a listener died, or a task was still running at the drain deadline
EXIT_ERROR = 2  # bad arguments, a class that cannot be loaded, Redis unreachable

EPILOG = """\
examples:
  python -m workers run examples.tutorial.shop:Shop --concurrency 8   # a TaskListener, 8 threads
  python -m workers run examples.seed_worker:StockListener --kind stock   # seed-style listener
  python -m workers wait                       # the built-in wait: kind (delay, event, latches)
  python -m workers resource --base-dir examples/ --allow-network 10.0.0.0/8   # URI sources, sinks
  python -m workers noop                       # end every task at once (benchmarks, tests)
  python -m workers simulate --delay-max 2 --failures 10

noop/simulate without --kinds serve every kind except built-in ones (wait), also the kinds that
appear while they run.
exit codes: 0 stopped cleanly, 1 a worker died or did not drain in time, 2 error (bad arguments,
class not loadable, Redis unreachable).
Redis: --redis-url or --redis-url-file, else REDIS_URL or REDIS_URL_FILE, else
REDIS_HOST/REDIS_PORT/REDIS_USERNAME/REDIS_PASSWORD.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workers",
        description="Task workers.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    redis_arguments(common)
    common.add_argument("--prefix", default="{flow}", help="key prefix (hash tag), default {flow}")
    partitions_argument(common)
    common.add_argument("--consumer", help="stable consumer name")
    common.add_argument("--claim-idle", type=float, default=30.0, help="seconds before claiming")
    common.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    metrics_arguments(common)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    kinds = argparse.ArgumentParser(add_help=False)
    kinds.add_argument("--kinds", nargs="+", help="task kinds to serve")
    noop = commands.add_parser("noop", parents=[common, kinds], help="end every task at once")
    simulate = commands.add_parser(
        "simulate", parents=[common, kinds], help="random delays and failures"
    )
    simulate.add_argument("--delay-max", type=float, default=1.0, help="longest task, seconds")
    simulate.add_argument("--failures", type=float, default=0.0, help="percent of tasks that fail")
    simulate.add_argument("--seed", type=int, help="random seed")

    run = commands.add_parser("run", parents=[common], help="run a listener class")
    run.add_argument("target", metavar="module:Class", help="an rqse.EventListener subclass")
    run.add_argument("--concurrency", type=int, default=1, help="instances (threads), default 1")
    run.add_argument("--kind", help="task kind (seed-style: required)")
    run.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to finish on stop")
    for command in (noop, run):
        command.add_argument(
            "--pack-answers",
            action="store_true",
            help="send a batch's successful answers as one end-tasks entry (once every "
            "lifecycle worker reads them: docs/operations.md)",
        )

    wait = commands.add_parser("wait", parents=[common], help="the built-in wait: kind")
    wait.add_argument("--no-events", action="store_true", help="leave wait:event to others")

    resource = commands.add_parser("resource", parents=[common], help="URI sources and sinks")
    resource.add_argument(
        "--base-dir", type=Path, help="the directory file: URIs are confined to (default: cwd)"
    )
    resource.add_argument(
        "--allow-network",
        dest="allow_networks",
        action="append",
        metavar="CIDR",
        help="a network http(s): URIs may reach, e.g. 10.0.0.0/8 (repeatable)",
    )
    resource.add_argument("--concurrency", type=int, default=4, help="instances (threads)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    where = "Redis"
    connections = None
    try:
        settings = resolve_url(args.redis_url, args.redis_url_file)
        where = f"Redis at {settings.masked_url} ({settings.origin})"
        connections = Connections.open(settings, cluster=args.cluster)
        home = connections.client_for(args.prefix)
        home.ping()
        partitions = stored_partitions(home, args.prefix, args.partitions)
        places = [(keys, connections.pool_for(keys.prefix)) for keys in partitions.all]
        metrics = None
        if args.metrics_port is not None:
            from lifecycle.metrics import ProcessMetrics

            metrics = ProcessMetrics()  # first: it counts the pools' round trips
            for _, pool in places:
                metrics.round_trips.count(pool)
        watch = watch_partition_count(home, partitions)
        try:
            # The kinds' limits live under the base prefix, on its own node in a cluster.
            home_pool = connections.pool_for(args.prefix) if partitions.count > 1 else None
            code = _command(args, places, metrics, home_pool)
        finally:
            if metrics is not None:
                metrics.stop()
            if watch is not None:
                watch.stop()
        return EXIT_STOPPED_BADLY if watch is not None and watch.changed else code
    except (RqseError, LifecycleError, WorkerError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except (redis.ConnectionError, redis.TimeoutError) as error:
        print(f"error: cannot reach {where}: {error}", file=sys.stderr)
        return EXIT_ERROR
    except redis.RedisError as error:
        print(f"error: {where}: {error}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if connections is not None:
            connections.close()


def _serve(args: argparse.Namespace, metrics: ProcessMetrics | None, listeners: list[Any]) -> None:
    """Count ``listeners`` and serve the metrics (when ``--metrics-port``), before any
    of them listens: a port that cannot be bound is an error before work starts."""
    if metrics is None:
        return
    from workers.metrics import watch_workers

    watch_workers(metrics, listeners)
    metrics.serve(args.metrics_port, args.metrics_host)


def _command(
    args: argparse.Namespace,
    places: list[tuple[Keys, redis.ConnectionPool]],
    metrics: ProcessMetrics | None = None,
    home_pool: redis.ConnectionPool | None = None,
) -> int:
    """Build the command's listeners, once per partition (``places``: each partition's
    keys and the pool on its Redis), and run them until stopped."""
    options: dict[str, Any] = {"consumer": args.consumer, "claim_idle": args.claim_idle}
    alone = len(places) == 1  # else a Runner handles the signals for all of them
    if args.command in ("noop", "simulate"):
        from workers.noop import NoopWorker, SimulatedWorker

        kinds = sorted(set(args.kinds)) if args.kinds else None  # None: every kind, as they appear
        workers: list[NoopWorker] = []
        for keys, pool in places:
            if args.command == "noop":
                workers.append(
                    NoopWorker(
                        kinds,
                        keys,
                        home_pool,
                        pool=pool,
                        handle_signals=alone,
                        pack_answers=args.pack_answers,
                        **options,
                    )
                )
            else:
                workers.append(
                    SimulatedWorker(
                        kinds,
                        keys,
                        delay_max=args.delay_max,
                        failures=args.failures,
                        seed=args.seed,
                        home_pool=home_pool,
                        pool=pool,
                        handle_signals=alone,
                        **options,
                    )
                )
        _serve(args, metrics, workers)
        if kinds is None:
            # Its tasks go to whichever consumer of the kind's group reads first: beside
            # a deployment's own workers it would answer a share of their tasks.
            log.warning(
                "%s worker: serving every task kind (but wait), also those your own "
                "workers serve, with %s; name the kinds with --kinds beside real workers",
                args.command,
                "each task's input as its output" if args.command == "noop" else "made-up outputs",
            )
        settle_process()
        if alone:
            workers[0].listen()
            return EXIT_OK
        return Runner(workers).run()
    if args.command == "wait":
        from workers.wait import WaitWorker

        waits = [
            WaitWorker(keys, pool=pool, events=not args.no_events, handle_signals=alone, **options)
            for keys, pool in places
        ]
        _serve(args, metrics, [listener for wait in waits for listener in wait.listeners])
        settle_process()
        if alone:
            waits[0].listen()
            return EXIT_OK
        return Runner(waits).run()
    from workers.runner import build_listener, load_listener_class

    if args.concurrency < 1:
        raise ValueError(f"--concurrency {args.concurrency}: expected 1 or more")
    if args.command == "resource":
        from workers.resources import ResourceWorker

        cls: Any = ResourceWorker
        extra = {"claim_idle": args.claim_idle, **resource_options(args)}
        kind = None
    else:
        cls = load_listener_class(args.target)
        extra = {"claim_idle": args.claim_idle} if _takes(cls, "claim_idle") else {}
        kind = args.kind
    listeners = [
        build_listener(
            cls,
            keys=keys,
            pool=pool,
            consumer=_consumer(args.consumer, n, args.concurrency),
            kind=kind,
            options=extra,
            home_pool=home_pool,
        )
        for keys, pool in places
        for n in range(args.concurrency)
    ]
    if getattr(args, "pack_answers", False):
        from workers.task import TaskListener

        for listener in listeners:
            if not isinstance(listener, TaskListener):
                raise ValueError(f"--pack-answers: {args.target} is not a workers.TaskListener")
            listener.pack_answers = True
    _serve(args, metrics, listeners)
    settle_process()
    return Runner(listeners, drain_timeout=getattr(args, "drain_timeout", 30.0)).run()


def resource_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ResourceWorker keywords the command line gives: ``base_dir`` (a Path) and
    ``allow_networks`` (CIDR texts), each only when given, so the worker's own
    defaults hold otherwise."""
    options: dict[str, Any] = {}
    if args.base_dir is not None:
        options["base_dir"] = args.base_dir
    if args.allow_networks:
        options["allow_networks"] = list(args.allow_networks)
    return options


def _consumer(name: str | None, n: int, count: int) -> str | None:
    """``NAME`` for one instance, ``NAME-0``, ``NAME-1``... for several; None: rqse's."""
    if name is None:
        return None
    return name if count == 1 else f"{name}-{n}"


def _takes(cls: type, name: str) -> bool:
    import inspect

    parameters = inspect.signature(cls).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
