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
