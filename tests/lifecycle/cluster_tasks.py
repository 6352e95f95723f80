"""A task worker for the cluster tests: its output says when it ran, so a test can read
from the workflows alone how many ran at once (no key outside a partition's tag)."""

from __future__ import annotations

import time
from typing import Any

from workers import Task, TaskListener


class Timed(TaskListener):
    """Runs 50 ms; answers with its start and end (wall clock, one host)."""

    kind = "lim"
    slot_check_interval = 0.2

    def run(self, task: Task) -> Any:
        start = time.time()
        time.sleep(0.05)
        return {"start": start, "end": time.time()}
