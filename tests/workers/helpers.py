"""Run flows against a real Redis with workers in threads, and wait on conditions."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import redis

from flowlang.compiler import compile_text
from lifecycle.keys import Keys
from lifecycle.stored_state import state_from_fields
from lifecycle.submit import start_workflow
from lifecycle.worker import LifecycleWorker
from tests.conftest import wait_until

KEYS = Keys()


def state(client: redis.Redis, workflow: str) -> dict[str, Any]:
    """The workflow's state as readers see it (entries of a chunked one gathered)."""
    fields = client.hgetall(KEYS.workflow(workflow))
    return state_from_fields(fields).to_whole_dict() if fields else {}  # type: ignore[arg-type]


def wait_for_end(client: redis.Redis, workflow: str, timeout: float = 10.0) -> dict[str, Any]:
    """The workflow's state once finished, failed or terminated."""
    return wait_until(
        lambda: (s := state(client, workflow)).get("status") not in (None, "running") and s,
        timeout,
        f"workflow {workflow} to end",
    )


def submit(
    client: redis.Redis, flow: str, input: Any = None, workflow_id: str | None = None
) -> str:
    return start_workflow(client, compile_text(flow), input, workflow_id)


def events(client: redis.Redis, stream: str, kind: str | None = None) -> list[tuple[str, dict]]:
    """(id, event) of every entry of ``stream`` (of one kind)."""
    found = []
    for entry_id, fields in client.xrange(stream):
        event = {k.decode(): orjson.loads(v) for k, v in fields.items()}
        if kind is None or event.get("kind") == kind:
            found.append((entry_id.decode(), event))
    return found


def entry_ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])


class Threads:
    """Listeners (anything with ``listen()`` and ``stop()``) running in daemon threads."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self.pool = pool
        self.running: list[tuple[Any, threading.Thread]] = []

    def start(self, listener: Any) -> Any:
        thread = threading.Thread(target=listener.listen, daemon=True)
        thread.start()
        self.running.append((listener, thread))
        return listener

    def lifecycle(self) -> LifecycleWorker:
        return self.start(LifecycleWorker(pool=self.pool, handle_signals=False, block_ms=100))

    def stop(self, listener: Any) -> None:
        for running, thread in self.running:
            if running is listener:
                running.stop()
                thread.join(timeout=10)

    def stop_all(self) -> None:
        for listener, _ in self.running:
            listener.stop()
        for _, thread in self.running:
            thread.join(timeout=10)
        self.running.clear()
