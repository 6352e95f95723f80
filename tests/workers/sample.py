"""Listener classes for `python -m workers run` in the process tests."""

from __future__ import annotations

from typing import Any

from workers import Task, TaskListener


class Upper(TaskListener):
    kind = "text"

    def run(self, task: Task) -> Any:
        return {"t": task.input["t"].upper()}


class NotAListener:
    """A class that is no rqse.EventListener, for the loader's error."""
