"""``python -m workers``: run the no-op or simulating task workers."""

from __future__ import annotations

import argparse
import logging
import sys

import redis

from lifecycle.keys import Keys
from rqse.connection import RedisSettings
from rqse.errors import RqseError
from workers.noop import NoopWorker, SimulatedWorker, served_kinds

__all__ = ["main"]

EPILOG = """\
examples:
  python -m workers noop                       # end every task at once (benchmarks, tests)
  python -m workers simulate --delay-max 2 --failures 10
  python -m workers noop --kinds default ml    # only these kinds

Without --kinds, serves every kind known when it starts except built-in ones (wait).
exit codes: 0 stopped cleanly, 2 error (bad arguments, Redis unreachable).
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workers",
        description="Task workers.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--redis-url", help="redis://, rediss:// or unix:// URL")
    common.add_argument("--prefix", default="{flow}", help="key prefix (hash tag), default {flow}")
    common.add_argument("--kinds", nargs="+", help="task kinds to serve")
    common.add_argument("--consumer", help="stable consumer name")
    common.add_argument("--claim-idle", type=float, default=30.0, help="seconds before claiming")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("noop", parents=[common], help="end every task at once, output = input")
    simulate = commands.add_parser("simulate", parents=[common], help="random delays and failures")
    simulate.add_argument("--delay-max", type=float, default=1.0, help="longest task, seconds")
    simulate.add_argument("--failures", type=float, default=0.0, help="percent of tasks that fail")
    simulate.add_argument("--seed", type=int, help="random seed")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    keys = Keys(args.prefix)
    try:
        settings = RedisSettings.resolve(url=args.redis_url)
        pool = settings.pool()
        kinds = served_kinds(redis.Redis(connection_pool=pool), keys, args.kinds)
        options = {"consumer": args.consumer, "pool": pool, "claim_idle": args.claim_idle}
        if args.command == "noop":
            worker: NoopWorker = NoopWorker(kinds, keys, **options)
        else:
            worker = SimulatedWorker(
                kinds,
                keys,
                delay_max=args.delay_max,
                failures=args.failures,
                seed=args.seed,
                **options,
            )
        worker.listen()
    except (RqseError, redis.RedisError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
