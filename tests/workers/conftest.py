from collections.abc import Iterator

import pytest
import redis

from tests.workers.helpers import Threads


@pytest.fixture
def threads(redis_url: str, redis_client: redis.Redis) -> Iterator[Threads]:
    """Start listeners with ``threads.start(...)``; all are stopped after the test."""
    pool = redis.ConnectionPool.from_url(redis_url)
    running = Threads(pool)
    try:
        yield running
    finally:
        running.stop_all()
        pool.disconnect()
