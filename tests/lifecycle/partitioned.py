"""Run a suite of flows on a deployment of several partitions and check each one
ended, exactly once, with the in-memory runner's output (no-op tasks answer with
their input; wait:delay does too)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import orjson
import redis

from flowlang.compiler import compile_text
from flowlang.runner import run
from lifecycle.deployment import Deployment
from lifecycle.keys import Keys
from lifecycle.stored_state import state_from_fields
from lifecycle.submit import start_workflow

# What the engine runs: chains, a fan-out and join around an iteration of a subflow,
# iterations, a guard inside one, a 70-way join (chunked state), a durable wait.
FLOWS = [
    ("A → B → C", lambda i: {"n": i}),
    ("A :x → * { B → C } → :y D; :x → E → :y; D → F|G", lambda i: [i, i + 1]),
    ("A → * B → C", lambda i: list(range(i % 5 + 1))),
    (
        "A → * { B → ? `$[?(@.keep=true)]` C } → D",
        lambda i: [{"keep": n % 2 == 0, "n": n} for n in range(3)],
    ),
    (" | ".join(f"T{n}" for n in range(70)) + " → J", lambda i: {"n": i}),
    ("A → wait:delay (- duration: 0.2 -) → B", lambda i: {"n": i}),
]


def _identity(call: Any) -> Any:
    return call.input


def submit_suite(deployment: Deployment, per_flow: int, prefix: str = "f") -> dict[str, Any]:
    """``per_flow`` workflows of each flow, each in its partition; the runner's output
    for each, by id."""
    expected = {}
    for f, (text, make_input) in enumerate(FLOWS):
        graph = compile_text(text)
        for i in range(per_flow):
            workflow = f"{prefix}{f}-w{i}"
            client, keys = deployment.for_workflow(workflow)
            start_workflow(client, graph, make_input(i), workflow, keys)
            outcome = run(graph, _identity, make_input(i))
            expected[workflow] = outcome.output
    return expected


def _ended(client: redis.Redis, keys: Keys, ids: list[str]) -> dict[str, Any] | None:
    """Each workflow's whole state once all have ended, else None."""
    pipe = client.pipeline(transaction=False)
    for workflow in ids:
        pipe.hgetall(keys.workflow(workflow))
    states = {
        workflow: state_from_fields(fields).to_whole_dict() if fields else {}
        for workflow, fields in zip(ids, pipe.execute(), strict=True)
    }
    if all(state.get("status") in ("finished", "failed") for state in states.values()):
        return states
    return None


def _ended_or_weather(client: redis.Redis, keys: Keys, ids: list[str]) -> dict[str, Any] | None:
    """:func:`_ended`, None while the cluster fails over (CLUSTERDOWN, a dead master)."""
    try:
        return _ended(client, keys, ids)
    except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterDownError):
        return None


def _wait_ended(
    client: redis.Redis, keys: Keys, ids: list[str], timeout: float, index: int
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (states := _ended_or_weather(client, keys, ids)) is None:
        if time.monotonic() > deadline:
            pipe = client.pipeline(transaction=False)
            for workflow in ids:
                pipe.hgetall(keys.workflow(workflow))
            left = {
                w: state_from_fields(f).to_whole_dict() if f else "absent"
                for w, f in zip(ids, pipe.execute(), strict=True)
            }
            left = {w: s for w, s in left.items() if s == "absent" or s.get("status") != "finished"}
            raise AssertionError(f"partition {index}: not ended in {timeout}s: {str(left)[:2000]}")
        time.sleep(0.05)
    return states


def check_suite(
    deployment: Deployment, expected: dict[str, Any], timeout: float = 60, everywhere: bool = True
) -> None:
    """Every workflow finished with its expected output, in its own partition, and ended
    exactly once there; no task instance started twice; ``everywhere``: the ids reached
    every partition."""
    partitions = deployment.partitions
    by_partition = partitions.group(expected)
    assert len(by_partition) == partitions.count or not everywhere
    for index, ids in by_partition.items():
        keys = partitions.keys(index)
        client = deployment.client_for(keys)
        states = _wait_ended(client, keys, ids, timeout, index)
        assert {w: s.get("status") for w, s in states.items()} == dict.fromkeys(ids, "finished")
        assert {w: s.get("output") for w, s in states.items()} == {w: expected[w] for w in ids}
        ends = Counter(
            orjson.loads(fields[b"workflow"])
            for _, fields in client.xrange(keys.lifecycle)
            if orjson.loads(fields[b"kind"]) == "end-workflow"
        )
        assert {w: ends[w] for w in ids} == dict.fromkeys(ids, 1)
        starts = Counter(orjson.loads(f[b"id"]) for _, f in client.xrange(keys.tasks("default")))
        assert max(starts.values(), default=1) == 1
