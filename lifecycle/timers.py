"""Durable timers: retries after a backoff and task timeouts, kept in a sorted set.

The advance script adds and cancels timers in the same transaction as the
state change they belong to; :class:`TimerPump` fires the due ones by
appending ``retry-task``/``timeout-task`` events to the lifecycle stream,
where they are handled like any other event. A crashed worker loses no timer:
the next pump fires it.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from lifecycle.keys import Keys
from rqse import lua

__all__ = ["TimerPump"]

log = logging.getLogger(__name__)

_SCRIPTS = lua.scripts_dir(__file__)


class TimerPump:
    """Fires due timers every ``interval`` seconds in a daemon thread (or on demand)."""

    def __init__(self, client: redis.Redis, keys: Keys, interval: float = 0.05, batch: int = 500):
        self.client = client
        self.keys = keys
        self.interval = interval
        self.batch = batch
        self.script = lua.load_script(client, "fire_timers", _SCRIPTS)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def fire_due(self, now_ms: int | None = None) -> int:
        """Fire every timer due at ``now_ms``; return how many fired."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        fired = 0
        while True:
            count = int(
                self.script(keys=[self.keys.timers, self.keys.lifecycle], args=[now, self.batch])
            )
            fired += count
            if count < self.batch:
                return fired

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="timer-pump", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self.fire_due()
            except redis.RedisError as error:  # Redis away: the listener reconnects; retry later
                log.warning("timers: %s; retrying", error)
                self._stopping.wait(1.0)
