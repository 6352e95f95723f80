"""Workers that do no real work: for tests, benchmarks and the demo.

:class:`NoopWorker` ends every task at once with its input as output;
:class:`SimulatedWorker` waits a random delay and fails a given share of tasks.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import orjson

from lifecycle.events import START_TASK, end_task, end_task_template, is_start_task
from lifecycle.keys import DEFAULT_KIND, TASK_GROUP, Keys
from rqse import EventListener
from rqse.deadletter import REJECTED
from rqse.errors import MalformedEntry

__all__ = ["NoopWorker", "SimulatedWorker", "served_kinds"]

BUILT_IN_KINDS = frozenset({"wait"})


def served_kinds(client: Any, keys: Keys, kinds: Iterable[str] | None = None) -> list[str]:
    """The kinds to serve: those given, else every known kind but the built-in ones."""
    if kinds:
        return sorted(set(kinds))
    known = {k.decode() for k in client.smembers(keys.kinds)}
    return sorted((known | {DEFAULT_KIND}) - BUILT_IN_KINDS)


_RAW = "raw"  # the event's key for the entry's own fields, on the pass-through path
_loads = orjson.loads


class NoopWorker(EventListener):
    """Ends every start-task of ``kinds`` at once: output = input.

    An engine start-task is answered without decoding it: the end-task's
    ``workflow``, ``key``, ``attempt``, ``token`` and ``output`` are the start-task's own JSON
    bytes (a benchmark measures the engine, not a worker's JSON round trip). Any
    other entry takes the ordinary path: decoded, and answered by ``end_task()``.
    """

    def __init__(self, kinds: Iterable[str], keys: Keys | None = None, **options: Any) -> None:
        self.keys = keys or Keys()
        streams = [self.keys.tasks(kind) for kind in kinds]
        options.setdefault("batch_size", 200)
        super().__init__(streams, TASK_GROUP, [START_TASK], **options)
        self._end_task = end_task_template(self.keys.lifecycle, self.consumer)
        # The echo is this class's own: a subclass that computes its output or handles
        # tasks itself gets decoded events.
        cls = type(self)
        self._passes_through = cls.output is NoopWorker.output and cls.process is NoopWorker.process

    def decode_entry(self, fields: dict[bytes, bytes], event_id: str) -> dict[str, Any]:
        if not self._passes_through or not is_start_task(fields.get(b"kind")):
            return self._decoded(fields, event_id)
        try:
            # What is copied is checked as the ordinary path would check it (each value
            # JSON on its own, of the engine's types); what is not copied is not decoded.
            workflow = _loads(fields[b"workflow"])
            key = _loads(fields[b"key"])
            attempt = _loads(fields[b"attempt"])
            token = _loads(fields[b"token"])
            _loads(fields.get(b"input", b"null"))
        except (KeyError, orjson.JSONDecodeError):
            return self._decoded(fields, event_id)
        if not (
            isinstance(workflow, str)
            and isinstance(key, str)
            and type(attempt) is int
            and isinstance(token, str)
            and sum(map(len, fields.values())) + sum(map(len, fields)) <= self._max_entry_bytes
        ):
            return self._decoded(fields, event_id)
        return {"kind": START_TASK, _RAW: fields}

    def _decoded(self, fields: dict[bytes, bytes], event_id: str) -> dict[str, Any]:
        """The ordinary path; a start-task that names no workflow goes to the dead
        letters at once (no delivery would make it answerable)."""
        event = super().decode_entry(fields, event_id)
        if event.get("kind") == START_TASK and not isinstance(event.get("workflow"), str):
            raise MalformedEntry(
                REJECTED, "start-task without a string 'workflow'", event_id, "workflow"
            )
        return event

    def output(self, event: dict[str, Any]) -> Any:
        return event.get("input")

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        fields = event.get(_RAW)
        if fields is None:
            answer = end_task(event, self.output(event), worker=self.consumer)
            self.emit(answer, self.keys.lifecycle)
            return True
        output = fields.get(b"input", b"{}")
        self.emit_filled(
            self._end_task,
            fields[b"workflow"],
            fields[b"key"],
            fields[b"attempt"],
            fields[b"token"],
            b"{}" if output == b"null" else output,  # as end_task(): {} for none
        )
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
