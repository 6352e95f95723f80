"""The two commit paths — one MULTI/EXEC for the whole batch, and advance.lua per
workflow after a race — write the same state for the same events."""

from __future__ import annotations

from typing import Any

import redis

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall
from lifecycle import records as rec
from lifecycle.engine.advance import Advancer
from lifecycle.keys import Keys
from tests.lifecycle.harness import Harness, ScriptOnly

FLOW = compile_text("A (- $retries: 1 -) → * { B → ? `$[?(@ > 1)]` C } → { D E } → F")


def task(call: TaskCall) -> Any:
    if call.name == "A":
        if call.attempt == 1:
            raise RuntimeError("first attempt fails")
        return [1, 2, 3]
    return call.input


def _run(client: redis.Redis, keys: Keys, advancer: type[Advancer]) -> dict[str, dict[bytes, Any]]:
    harness = Harness(client, keys)
    harness.advancer = advancer(client, keys, clock=lambda: 1_000)
    ids = [harness.submit(FLOW, None, f"w{n}") for n in range(3)]
    harness.pump(task)
    records = {}
    for workflow in ids:
        fields = client.hgetall(keys.workflow(workflow))
        fields.pop(rec.SALT.encode())  # chosen at random per submission
        records[workflow] = fields
    return records


def test_the_transaction_path_and_the_script_path_store_the_same_records(
    redis_client: redis.Redis,
) -> None:
    watched = _run(redis_client, Keys("{watched}"), Advancer)
    before = _script_calls(redis_client)
    scripted = _run(redis_client, Keys("{scripted}"), ScriptOnly)
    assert _script_calls(redis_client) - before >= 3 * 6  # every commit went through Lua
    assert watched == scripted
    assert all(b'"finished"' in fields[rec.STATE.encode()] for fields in watched.values())


def _script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))


def echo(call: TaskCall) -> Any:
    return call.input


def _controlled(client: redis.Redis, keys: Keys, advancer: type[Advancer]) -> dict[str, Any]:
    """Every control on both paths: paused and resumed, terminated and restarted, deleted
    and started again in one batch, ended under retention."""
    import orjson

    from lifecycle.client import Client
    from lifecycle.events import control, start_workflow

    def send(*events: dict[str, Any]) -> None:
        for event in events:
            client.xadd(keys.lifecycle, {k: orjson.dumps(v) for k, v in event.items()})

    harness = Harness(client, keys)
    harness.advancer = advancer(client, keys, clock=lambda: 1_000, retain_ms=60_000)
    ops = Client(client, keys)
    graph = compile_text("A → B|C → D")
    for n in range(3):
        harness.submit(graph, {"n": n}, f"c{n}")
    harness.advance()
    send(control("pause-workflow", "c0"), control("terminate-workflow", "c1", "stop"))
    harness.advance()
    harness.work(echo)
    harness.advance()
    send(control("resume-workflow", "c0"), control("restart-workflow", "c1"))
    harness.pump(echo)
    digest = client.hget(keys.workflow("c2"), rec.GRAPH).decode()
    send(control("delete-workflow", "c2"), start_workflow("c2", digest, {"n": 9}, "salt"))
    harness.pump(echo)
    assert {ops.status(f"c{n}").state for n in range(3)} == {"finished"}
    records: dict[str, Any] = {}
    for n in range(3):
        fields = client.hgetall(keys.workflow(f"c{n}"))
        fields.pop(rec.SALT.encode())
        records[f"c{n}"] = fields
    records["expiring"] = client.zrange(keys.expiring, 0, -1, withscores=True)
    records["stopped"] = client.hgetall(keys.stopped)
    records["index"] = client.zrange(keys.workflows, 0, -1)
    return records


def test_both_commit_paths_store_the_same_records_for_every_control(
    redis_client: redis.Redis,
) -> None:
    watched = _controlled(redis_client, Keys("{watched}"), Advancer)
    scripted = _controlled(redis_client, Keys("{scripted}"), ScriptOnly)
    assert watched == scripted
    assert watched["stopped"] == {} and len(watched["expiring"]) == 3
