"""A listener of a limited kind for `python -m workers run` in the slot lease tests."""

from __future__ import annotations

import time
from typing import Any

import redis

from workers import Task, TaskListener

HELD_STARTED = "test:held:started"  # a list: the task id of each run started


class Holder(TaskListener):
    """Records that it started, then holds its slot for ``input["seconds"]``."""

    kind = "held"
    slot_lease = 1.5  # short: the test kills the process holding a slot

    def run(self, task: Task) -> Any:
        redis.Redis(connection_pool=self.pool).rpush(HELD_STARTED, task.id)
        time.sleep(task.input["seconds"])
        return {"by": self.consumer}
