"""A handler cut short by stop() leaves its entry pending for another consumer, and the
log says so without a traceback: stopping is expected, not a failure."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis

from rqse import EventListener
from tests.conftest import wait_until
from tests.rqse.helpers import Running

STREAM = "stop-test"


class Sleeper(EventListener):
    """Holds each entry until stopped, as a simulated task does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.holding = threading.Event()

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        self.holding.set()
        if self.sleep(60):
            raise InterruptedError("stopping")
        return True


def test_a_handler_interrupted_by_stop_logs_no_traceback_and_leaves_its_entry_pending(
    redis_client: redis.Redis,
    redis_url: str,
    run_listener: Callable[..., Running],
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = redis.ConnectionPool.from_url(redis_url)
    sleeper = Sleeper(STREAM, "g", pool=pool, handle_signals=False, block_ms=100)
    running = run_listener(sleeper)
    redis_client.xadd(STREAM, {"kind": '"k"'})
    wait_until(sleeper.holding.is_set, what="the entry in hand")
    with caplog.at_level(logging.DEBUG, logger="rqse"):
        running.stop()
    failures = [r for r in caplog.records if "process() failed" in r.getMessage()]
    assert failures and all(r.levelno == logging.DEBUG for r in failures)
    assert redis_client.xpending(STREAM, "g")["pending"] == 1
    pool.disconnect()
