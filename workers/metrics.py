"""The task workers' metrics: ``flowstream_task_seconds{kind}``, beside the events and
round trips every worker process counts (:class:`lifecycle.metrics.ProcessMetrics`)."""

from __future__ import annotations

from collections.abc import Iterable

from lifecycle.metrics import ProcessMetrics
from rqse import EventListener

__all__ = ["TASK_BUCKETS", "watch_workers"]

#: From an instant task to a long remote job: seconds of one run().
TASK_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


def watch_workers(metrics: ProcessMetrics, listeners: Iterable[EventListener]) -> None:
    """Count the events of ``listeners``; those that run tasks (a ``task_seconds``
    attribute: TaskListener, SimulatedWorker) observe each task's seconds too."""
    histogram = metrics.histogram(
        "task_seconds",
        "Seconds a task worker spent running one task (failed ones included), by kind",
        TASK_BUCKETS,
        ("kind",),
    )
    for listener in listeners:
        metrics.watch(listener)
        if hasattr(listener, "task_seconds"):
            listener.task_seconds = histogram
