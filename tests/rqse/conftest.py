"""Fixtures of the rqse tests (the Redis server itself comes from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rqse import EventListener
from rqse.server import RedisServer
from tests.rqse.helpers import Running
from tests.rqse.proxy import Proxy


@pytest.fixture
def run_listener() -> Iterator[Callable[..., Running]]:
    """Start listeners in threads; any still running are stopped at teardown."""
    started: list[Running] = []

    def start(listener: EventListener, **listen_args: Any) -> Running:
        running = Running(listener, **listen_args)
        started.append(running)
        return running

    yield start
    for running in started:
        if running.thread.is_alive():
            running.stop()


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A private server this test may kill and restart (AOF, fsync on every write)."""
    server = RedisServer(persistence="aof-always").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[Proxy]:
    """A loopback TCP proxy in front of the module's own ``server`` fixture."""
    proxy = Proxy(server.port)
    try:
        yield proxy
    finally:
        proxy.close()
