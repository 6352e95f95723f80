"""Pump: fire what is due, from a daemon thread, by calling one Lua script.

Durable timers live in sorted sets scored by their due time (ms); a script
turns the due ones into stream entries and removes them, atomically, so any
number of pumps may run and each timer fires once. :class:`Pump` calls such a
script every ``interval`` seconds until a call fires fewer than ``batch``. The
script's contract: KEYS as given, ``ARGV[1]`` now in ms (``''``: Redis's own
clock, so hosts with skewed clocks agree), ``ARGV[2]`` the batch size, then the
pump's own ``args``; it
returns how many fired (or a list whose first element is that).

Redis trouble is weather: the pump backs off, logs once per change, and tries
again; nothing is lost meanwhile, because the timers stay in Redis.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import redis

from rqse.backoff import Backoff
from rqse.weather import Forecast

__all__ = ["Pump"]

log = logging.getLogger(__name__)


class Pump:
    """Calls ``script(keys, [now, batch])`` until the due entries are all fired."""

    def __init__(
        self,
        script: Any,  # a redis-py Script (rqse.lua.load_script)
        keys: Sequence[str],
        *,
        name: str,
        interval: float = 0.05,
        batch: int = 500,
        args: Sequence[str | int] = (),
    ) -> None:
        self.script = script
        self.keys = list(keys)
        self.args = list(args)  # passed after now and the batch size
        self.name = name
        self.interval = interval
        self.batch = batch
        self.fired = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def fire_due(self, now_ms: int | None = None) -> int:
        """Fire everything due at ``now_ms`` (default: Redis's clock); return how many."""
        now = "" if now_ms is None else now_ms
        fired = 0
        while True:
            reply = self.script(keys=self.keys, args=[now, self.batch, *self.args])
            count = int(reply[0] if isinstance(reply, list) else reply)
            fired += count
            if count < self.batch:
                self.fired += fired
                return fired

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        backoff, forecast = Backoff(), Forecast(self.name, log)
        while not self._stopping.wait(self.interval):
            try:
                self.fire_due()
            except redis.RedisError as error:
                delay = backoff.next_delay()
                if forecast.storm(error, self.name, delay) is None:
                    log.warning("%s: %s; retrying in %.2fs", self.name, error, delay)
                self._stopping.wait(delay)
            else:
                backoff.reset()
                forecast.clear()
