"""Workers that do no real work: for tests, benchmarks and the demo.

:class:`NoopWorker` ends every task at once with its input as output;
:class:`SimulatedWorker` waits a random delay and fails a given share of tasks.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from lifecycle.events import START_TASK, end_task
from lifecycle.keys import DEFAULT_KIND, TASK_GROUP, Keys
from rqse import EventListener

__all__ = ["NoopWorker", "SimulatedWorker", "served_kinds"]

BUILT_IN_KINDS = frozenset({"wait"})


def served_kinds(client: Any, keys: Keys, kinds: Iterable[str] | None = None) -> list[str]:
    """The kinds to serve: those given, else every known kind but the built-in ones."""
    if kinds:
        return sorted(set(kinds))
    known = {k.decode() for k in client.smembers(keys.kinds)}
    return sorted((known | {DEFAULT_KIND}) - BUILT_IN_KINDS)


class NoopWorker(EventListener):
    """Ends every start-task of ``kinds`` at once: output = input."""

    def __init__(self, kinds: Iterable[str], keys: Keys | None = None, **options: Any) -> None:
        self.keys = keys or Keys()
        streams = [self.keys.tasks(kind) for kind in kinds]
        options.setdefault("batch_size", 200)
        super().__init__(streams, TASK_GROUP, [START_TASK], **options)

    def output(self, event: dict[str, Any]) -> Any:
        return event.get("input")

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        self.emit(end_task(event, self.output(event), worker=self.consumer), self.keys.lifecycle)
        return True


class SimulatedWorker(NoopWorker):
    """Waits up to ``delay_max`` seconds per task and fails ``failures`` percent of them."""

    def __init__(
        self,
        kinds: Iterable[str],
        keys: Keys | None = None,
        delay_max: float = 0.5,
        failures: float = 0.0,
        seed: int | None = None,
        **options: Any,
    ) -> None:
        options.setdefault("batch_size", 1)
        super().__init__(kinds, keys, **options)
        self.delay_max = delay_max
        self.failures = failures
        self.random = random.Random(seed)

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        if self.delay_max > 0 and self.sleep(self.random.uniform(0, self.delay_max)):
            raise InterruptedError("stopping")  # left pending: another worker takes it
        if self.random.uniform(0, 100) < self.failures:
            failed = end_task(event, error="simulated failure", worker=self.consumer)
            self.emit(failed, self.keys.lifecycle)
        else:
            self.emit(
                end_task(event, self.output(event), worker=self.consumer), self.keys.lifecycle
            )
        return True

    def output(self, event: dict[str, Any]) -> Any:
        """The input, with an object's ``done`` list extended by this task's name."""
        value = event.get("input")
        if isinstance(value, dict):
            return {**value, "done": [*value.get("done", []), event.get("name")]}
        return value
