"""SIGTERM ends a listener within its drain timeout, whatever it is doing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rqse import EventClient, message
from rqse.server import RedisServer
from tests.conftest import wait_until
from tests.rqse.proxy import Proxy

CHILD = Path(__file__).with_name("weather_child.py")
DRAIN = 2.0


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def child(server: RedisServer, proxy: Proxy) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [sys.executable, str(CHILD), proxy.url, server.url, str(DRAIN)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    direct = redis.Redis(port=server.port)
    wait_until(lambda: direct.llen("ready") or process.poll() is not None, what="child ready")
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stderr:
            process.stderr.close()
        direct.close()


def terminate(process: subprocess.Popen[bytes]) -> tuple[int, float, str]:
    """SIGTERM; (exit code, seconds it took, stderr)."""
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=DRAIN + 5)
    except subprocess.TimeoutExpired:
        pytest.fail("the listener did not exit on SIGTERM")
    took = time.monotonic() - start
    stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
    return code, took, stderr


def test_sigterm_cuts_a_read_blocked_on_a_redis_that_stopped_answering(child, proxy, server):
    time.sleep(0.2)  # the child is in its blocking read
    proxy.stall()  # CLIENT UNBLOCK cannot get through either
    code, took, stderr = terminate(child)
    assert code == 0, stderr
    assert took < DRAIN, f"took {took:.2f}s"
    assert redis.Redis(port=server.port).get("stopped") == b"child", "onStop ran"
    assert "Traceback" not in stderr


def test_sigterm_ends_the_backoff_while_redis_is_away(child, proxy):
    proxy.down()
    time.sleep(0.5)  # backing off: reconnection refused
    code, took, stderr = terminate(child)
    assert code == 0, stderr
    assert took < DRAIN, f"took {took:.2f}s"
    assert "Traceback" not in stderr


def test_sigterm_exits_at_the_drain_timeout_when_a_write_hangs(child, proxy, server):
    direct = redis.Redis(port=server.port)
    EventClient("jobs", url=server.url).append(message({"n": 1, "hold": True}, kind="job"))
    wait_until(lambda: direct.llen("done"), what="the entry in hand")
    proxy.stall()
    direct.rpush("go", 1)  # process() returns; the acknowledgement hangs on the stall
    time.sleep(0.2)
    code, took, stderr = terminate(child)
    assert code == 128 + signal.SIGTERM, stderr
    assert DRAIN - 0.1 < took < DRAIN + 2, f"took {took:.2f}s"
    assert "exiting now" in stderr
    assert direct.xpending("jobs", "g")["pending"] == 1, "left pending for redelivery"
