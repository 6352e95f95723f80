"""Task workers: the task contract, built-in tasks, simulators (see docs/workers.md).

Write a worker by subclassing :class:`TaskListener` (or, seed style, any
``rqse.EventListener``) and run it with ``python -m workers run module:Class``.
"""

from workers.errors import (
    BadTask,
    ResourceError,
    TemplateError,
    WaitParameterError,
    WorkerError,
    WorkerLoadError,
)
from workers.task import HandBack, Task, TaskListener

__all__ = [
    "BadTask",
    "HandBack",
    "ResourceError",
    "Task",
    "TaskListener",
    "TemplateError",
    "WaitParameterError",
    "WorkerError",
    "WorkerLoadError",
]
