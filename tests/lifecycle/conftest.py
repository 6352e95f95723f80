from typing import Any

import pytest
import redis

from tests.lifecycle.harness import Harness


@pytest.fixture
def harness(redis_client: redis.Redis) -> Harness:
    return Harness(redis_client)


class Engine:
    """A lifecycle worker and a no-op (or failing) task worker in threads."""

    def __init__(self, url: str) -> None:
        import threading

        import redis as redis_module

        from lifecycle.worker import LifecycleWorker
        from workers.noop import NoopWorker

        self.pool = redis_module.ConnectionPool.from_url(url)
        self.workers = [
            LifecycleWorker(pool=self.pool, handle_signals=False, block_ms=100),
            NoopWorker(["default", "ml"], pool=self.pool, handle_signals=False, block_ms=100),
        ]
        self.threads = [threading.Thread(target=w.listen, daemon=True) for w in self.workers]
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        for thread in self.threads:
            thread.join(timeout=10)
        self.pool.disconnect()


@pytest.fixture
def engine(redis_url: str, redis_client: redis.Redis):
    running = Engine(redis_url)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def pool(redis_url: str, redis_client: redis.Redis):
    """A connection pool for listeners started by the test (after the database is clean)."""
    connections = redis.ConnectionPool.from_url(redis_url)
    yield connections
    connections.disconnect()


@pytest.fixture
def in_threads():
    """``in_threads(*listeners)``: each listens in a thread until the test ends."""
    import threading

    started: list[tuple[Any, threading.Thread]] = []

    def start(*listeners: Any) -> None:
        for listener in listeners:
            thread = threading.Thread(target=listener.listen, daemon=True)
            thread.start()
            started.append((listener, thread))

    yield start
    for listener, _ in started:
        listener.stop()
    for _, thread in started:
        thread.join(timeout=10)
