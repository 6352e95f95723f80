"""Listener classes for `python -m workers run` in the process tests."""

from __future__ import annotations

import time
from typing import Any

from workers import Task, TaskListener


class Upper(TaskListener):
    kind = "text"

    def run(self, task: Task) -> Any:
        return {"t": task.input["t"].upper()}


class NotAListener:
    """A class that is no rqse.EventListener, for the loader's error."""


SLEEPER_RUNS = "test:sleeper:runs"  # a list: the consumer of each run, in order


class Sleeper(TaskListener):
    """Sleeps ``input["seconds"]``, then answers with its consumer name; records each run
    it starts (for the tests of stalled and slow holders)."""

    kind = "sleepy"

    def run(self, task: Task) -> Any:
        self.connection.rpush(SLEEPER_RUNS, self.consumer)
        time.sleep(task.input["seconds"])
        return {"by": self.consumer}
