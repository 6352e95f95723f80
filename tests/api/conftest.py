"""An API server on a free loopback port, with a lifecycle worker and a simulated task
worker in threads, on the test's Redis; requests go over real HTTP (httpx)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis
import uvicorn

from flowstream.api.app import create_app
from flowstream.api.auth import Tokens
from flowstream.api.context import ApiConfig
from lifecycle.keys import Keys
from lifecycle.worker import LifecycleWorker
from workers.noop import SimulatedWorker

OPERATE_TOKEN = "operate-token-0123456789abcdef"
READ_TOKEN = "read-token-0123456789abcdef"
MAX_STREAMS = 3
TOKENS = Tokens.parse(f"operate:{OPERATE_TOKEN}\nread:{READ_TOKEN}\n", "test")


@dataclass
class Served:
    url: str
    redis: redis.Redis
    keys: Keys

    def client(self, token: str | None = OPERATE_TOKEN, **options: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(options.pop("headers", {}))
        return httpx.Client(base_url=self.url, headers=headers, timeout=10, **options)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_server(config: ApiConfig) -> tuple[uvicorn.Server, threading.Thread, str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            timeout_graceful_shutdown=1,
        )
    )
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the API server did not start")
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture
def served(redis_client: redis.Redis) -> Iterator[Served]:
    """The API with tokens (``OPERATE_TOKEN``, ``READ_TOKEN``) and workers that run every
    task of kind ``default`` in up to 50 ms."""
    keys = Keys()
    pool = redis_client.connection_pool
    workers: list[Any] = [
        LifecycleWorker(keys, pool=pool, handle_signals=False),
        SimulatedWorker(["default"], keys, delay_max=0.05, pool=pool, handle_signals=False),
    ]
    threads = [threading.Thread(target=w.listen, daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    config = ApiConfig(redis_client, keys, TOKENS, max_streams=MAX_STREAMS, poll_s=0.1)
    server, thread, url = run_server(config)
    try:
        yield Served(url, redis_client, keys)
    finally:
        server.should_exit = True
        thread.join(5)
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(10)


def wait_state(
    http: httpx.Client, workflow_id: str, states: tuple[str, ...], timeout: float = 10
) -> dict[str, Any]:
    """The workflow once it is in one of ``states`` (fails the test after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        data: dict[str, Any] = http.get(f"/api/workflows/{workflow_id}").json()
        if data.get("state") in states:
            return data
        if time.monotonic() > deadline:
            pytest.fail(
                f"workflow {workflow_id} not {states} after {timeout}s: {data.get('state')}"
            )
        time.sleep(0.05)
