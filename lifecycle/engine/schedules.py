"""The schedule pump: the lifecycle workers fire the schedules (no process of its own).

Each worker's pump asks Redis for its clock and the schedules due by it, every
``interval``; :meth:`lifecycle.schedules.Schedules.fire` starts what each one's
fire times call for. However many workers pump, a fire time starts one workflow
(``fire_schedule.lua`` moves the next fire time only if nobody moved it first),
and a worker that dies between reading and firing loses nothing: the schedule
stays due for the next pump.
"""

from __future__ import annotations

import redis

from lifecycle.keys import Keys
from lifecycle.schedules import Schedules
from rqse.pump import Pump

__all__ = ["SchedulePump"]


class SchedulePump(Pump):
    """A :class:`rqse.pump.Pump` whose step is :meth:`Schedules.fire_due` (Python works
    out the fire times; the script only starts them), with the pump's backoff."""

    def __init__(
        self, client: redis.Redis, keys: Keys, interval: float = 0.2, batch: int = 100
    ) -> None:
        super().__init__(None, [], name="schedules", interval=interval, batch=batch)
        self.schedules = Schedules(client, keys)

    def fire_due(self, now_ms: int | None = None) -> int:
        """Fire the schedules due at ``now_ms`` (default: Redis's clock); return how many
        workflows started."""
        started = self.schedules.fire_due(now_ms, self.batch)
        self.fired += started
        return started
