"""The two commit paths — one MULTI/EXEC for the whole batch, and advance.lua per
workflow after a race — write the same state for the same events."""

from __future__ import annotations

from typing import Any

import redis

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall
from lifecycle import records as rec
from lifecycle.engine.advance import Advancer
from lifecycle.engine.commit import Commit
from lifecycle.keys import Keys
from tests.lifecycle.harness import Harness

FLOW = compile_text("A (- $retries: 1 -) → * { B → ? `$[?(@ > 1)]` C } → { D E } → F")


class ScriptOnly(Advancer):
    """Every batch loses its watched transaction (as after a race with another worker),
    so every workflow is committed by advance.lua."""

    def _commit_watched(
        self, commits: list[Commit], extra_acks: list[str], send: Any
    ) -> list[bool]:
        send([("UNWATCH",)])
        return [False] * len(commits)


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
