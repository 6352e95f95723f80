"""Durable timers: retries after a backoff and task timeouts, kept in a sorted set.

The advance adds and cancels timers in the same transaction as the state change
they belong to; :func:`timer_pump` fires the due ones (``fire_timers.lua``) by
appending ``retry-task``/``timeout-task`` events to the lifecycle stream, where
they are handled like any other event. A crashed worker loses no timer: the
next pump fires it.
"""

from __future__ import annotations

import redis

from lifecycle.keys import Keys
from rqse import lua
from rqse.pump import Pump

__all__ = ["timer_pump"]

_SCRIPTS = lua.scripts_dir(__file__)


def timer_pump(client: redis.Redis, keys: Keys, interval: float = 0.05, batch: int = 500) -> Pump:
    """The pump that fires the lifecycle's due timers (``start()`` it, or ``fire_due()``)."""
    script = lua.load_script(client, "fire_timers", _SCRIPTS)
    return Pump(
        script, [keys.timers, keys.lifecycle], name="timers", interval=interval, batch=batch
    )
