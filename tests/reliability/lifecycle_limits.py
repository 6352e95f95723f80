"""A lifecycle worker with other limits: ``python -m tests.reliability.lifecycle_limits
--items N --redis-url URL``. The CLI has no option for them; the fan-out scenario
raises the item limit to fan out past the default."""

from __future__ import annotations

import argparse
import logging

import redis

from flowlang.limits import Limits
from lifecycle.advance import Advancer
from lifecycle.keys import Keys
from lifecycle.worker import LifecycleWorker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--items", type=int, required=True, help="items one `*` may fan out to")
    parser.add_argument("--consumer", default="lifecycle-limits")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    client = redis.Redis.from_url(args.redis_url)
    keys = Keys()
    worker = LifecycleWorker(
        keys, consumer=args.consumer, pool=client.connection_pool, claim_idle=1.0
    )
    worker.advancer = Advancer(worker.connection, keys, limits=Limits(items=args.items))
    worker.listen()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
