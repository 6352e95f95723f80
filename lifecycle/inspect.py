"""What ``inspect`` and ``list`` show: workflow records turned into plain data."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import redis

from flowlang.machine import parse_key
from lifecycle.keys import Keys
from lifecycle.store import GraphCache, load_workflow

__all__ = ["describe_workflow", "list_workflows", "iso"]


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def describe_workflow(client: redis.Redis, keys: Keys, workflow_id: str) -> dict[str, Any]:
    """State, every task instance with its times, attempts, input and output."""
    record = load_workflow(client, keys, workflow_id)
    running = record.state.running
    nodes = []
    # A workflow terminated before it started has no graph and no task.
    graph = GraphCache(client, keys).machine(record.graph).graph if record.graph else None
    for key in sorted(set(record.starts) | set(record.ends), key=_key_order):
        assert graph is not None
        attempt, started, task_input = record.starts.get(key, [None, None, None])
        ended, ok, output, error, worker = [
            *record.ends.get(key, []),
            None,
            None,
            None,
            None,
            None,
        ][:5]
        if key in running:
            state = "running"
            ended = output = error = None
        elif ok is None:
            state = "abandoned"  # the workflow ended (failed, terminated) while it ran
        else:
            state = "ended" if ok else "failed"
        node = graph.nodes[parse_key(key)[0]]
        nodes.append(
            {
                "key": key,
                "name": node.name,
                "kind": str(node.kind),
                "state": state,
                "attempts": attempt,
                "started": iso(started),
                "ended": iso(ended),
                "worker": worker,
                "input": task_input,
                "output": output,
                "error": error,
            }
        )
    return {
        "id": record.id,
        "flow": record.name,
        "graph": record.graph,
        "state": record.status,
        "created": iso(record.created),
        "ended": iso(record.ended),
        "input": record.input,
        "output": record.output,
        "error": record.error,
        "tasks": nodes,
    }


def _key_order(key: str) -> tuple[int, ...]:
    node, path = parse_key(key)
    return (node, *path)


def list_workflows(
    client: redis.Redis, keys: Keys, state: str | None = None, flow: str | None = None
) -> list[dict[str, Any]]:
    """One summary per workflow, oldest first, filtered by state and flow name."""
    ids = [i.decode() for i in client.zrange(keys.workflows, 0, -1)]
    pipe = client.pipeline(transaction=False)
    for workflow_id in ids:
        pipe.hmget(keys.workflow(workflow_id), "name", "s", "created", "ended")
    rows = []
    for workflow_id, (name, raw_state, created, ended) in zip(ids, pipe.execute(), strict=True):
        status = orjson.loads(raw_state).get("status") if raw_state else "unknown"
        flow_name = name.decode() if name else None
        if (state and status != state) or (flow and flow_name != flow):
            continue
        rows.append(
            {
                "id": workflow_id,
                "flow": flow_name,
                "state": status,
                "created": iso(int(created)) if created else None,
                "ended": iso(int(ended)) if ended else None,
            }
        )
    return rows
