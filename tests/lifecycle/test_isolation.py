"""One workflow's bad data fails that workflow alone; the rest of its batch commits.

Every case puts a poisoned workflow in the same lifecycle batch as bystanders and
checks: the poisoned one is ``failed`` with the reason, the event that poisoned it
is refused with that reason (the worker dead-letters it), every bystander
advanced as if it were alone, nothing is left pending.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from flowlang.limits import Limits
from lifecycle import events as ev
from lifecycle.engine.advance import Advancer
from lifecycle.engine.store import load_workflow
from lifecycle.keys import Keys
from lifecycle.submit import start_workflow
from tests.lifecycle.harness import Harness, ScriptOnly, decode

KEYS = Keys()
FLOW = compile_text("A → B")


def _read_batch(client: redis.Redis) -> list[tuple[str, dict[str, Any]]]:
    reply = client.xreadgroup(KEYS.lifecycle_group, "t", {KEYS.lifecycle: ">"}, count=1000)
    return [(i.decode(), decode(f)) for _, items in reply or [] for i, f in items]


def _bystanders(harness: Harness, n: int = 5) -> list[str]:
    return [harness.submit(FLOW, {"n": i}, f"bystander-{i}") for i in range(n)]


def _assert_bystanders_started(client: redis.Redis, ids: list[str]) -> None:
    for workflow in ids:
        record = load_workflow(client, KEYS, workflow)
        assert record.status == "running" and sorted(record.starts) == ["1"], workflow


def _xadd(client: redis.Redis, event: dict[str, Any]) -> str:
    return client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in event.items()}).decode()


def test_an_input_past_the_size_limit_fails_its_workflow_and_not_the_batch(
    harness: Harness, redis_client: redis.Redis
) -> None:
    bystanders = _bystanders(harness)
    poisoned = _xadd(
        redis_client, ev.start_workflow("big", FLOW.content_hash(), {"blob": "x" * 5000})
    )
    result = Advancer(redis_client, KEYS, limits=Limits(value_bytes=1000)).apply(
        _read_batch(redis_client)
    )
    record = load_workflow(redis_client, KEYS, "big")
    assert record.status == "failed" and "limit of 1,000" in (record.error or "")
    assert [event_id for event_id, _ in result.rejected] == [poisoned]
    assert "workflow big failed" in result.rejected[0][1]
    _assert_bystanders_started(redis_client, bystanders)
    assert redis_client.xpending(KEYS.lifecycle, KEYS.lifecycle_group)["pending"] == 0


def test_an_output_nested_past_the_depth_limit_fails_its_workflow_alone(
    harness: Harness, redis_client: redis.Redis
) -> None:
    victim = harness.submit(FLOW, {}, "deep")
    harness.advance()
    start = decode(redis_client.xrange(KEYS.tasks("default"))[0][1])
    bystanders = _bystanders(harness)
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    _xadd(redis_client, ev.end_task(start, deep))
    result = Advancer(redis_client, KEYS, limits=Limits(depth=32)).apply(_read_batch(redis_client))
    record = load_workflow(redis_client, KEYS, victim)
    assert record.status == "failed" and "deeper than 32" in (record.error or "")
    assert record.state.running == {}
    assert len(result.rejected) == 1
    _assert_bystanders_started(redis_client, bystanders)


def test_a_corrupt_stored_record_fails_its_workflow_and_the_batch_goes_on(
    harness: Harness, redis_client: redis.Redis
) -> None:
    victim = harness.submit(FLOW, {}, "corrupt")
    harness.advance()
    start = decode(redis_client.xrange(KEYS.tasks("default"))[0][1])
    redis_client.hset(KEYS.workflow(victim), "s", b"{not json")
    bystanders = _bystanders(harness)
    _xadd(redis_client, ev.end_task(start, {"ok": 1}))
    result = Advancer(redis_client, KEYS).apply(_read_batch(redis_client))
    stored = orjson.loads(redis_client.hget(KEYS.workflow(victim), "s"))
    assert stored["status"] == "failed" and "corrupt" in stored["error"]
    assert len(result.rejected) == 1 and "corrupt" in result.rejected[0][1]
    _assert_bystanders_started(redis_client, bystanders)


def test_a_start_naming_a_graph_nobody_stored_fails_that_workflow_alone(
    harness: Harness, redis_client: redis.Redis
) -> None:
    bystanders = _bystanders(harness)
    _xadd(redis_client, ev.start_workflow("orphan", "0" * 64, {}))
    result = Advancer(redis_client, KEYS).apply(_read_batch(redis_client))
    record = load_workflow(redis_client, KEYS, "orphan")
    assert record.status == "failed" and record.error
    assert len(result.rejected) == 1
    _assert_bystanders_started(redis_client, bystanders)


@pytest.mark.parametrize(
    "field, value",
    [("workflow", 12), ("key", None), ("attempt", "one"), ("status", "MAYBE")],
)
def test_a_malformed_end_task_is_refused_naming_its_field_and_changes_nothing(
    harness: Harness, redis_client: redis.Redis, field: str, value: Any
) -> None:
    victim = harness.submit(FLOW, {}, "victim")
    harness.advance()
    start = decode(redis_client.xrange(KEYS.tasks("default"))[0][1])
    bad = {**ev.end_task(start, {}), field: value}
    bad_id = _xadd(redis_client, bad)
    bystanders = _bystanders(harness)
    result = Advancer(redis_client, KEYS).apply(_read_batch(redis_client))
    assert [event_id for event_id, _ in result.rejected] == [bad_id]
    assert bad_id in result.rejected[0][1] and field in result.rejected[0][1]
    assert load_workflow(redis_client, KEYS, victim).status == "running"
    _assert_bystanders_started(redis_client, bystanders)


def _poison_stream(client: redis.Redis) -> None:
    """A task stream that is not a stream: Redis refuses the XADD of its start-task."""
    client.set(KEYS.tasks("broken"), "not a stream")


def test_a_write_redis_refuses_in_the_batch_transaction_fails_that_workflow_alone(
    harness: Harness, redis_client: redis.Redis
) -> None:
    _poison_stream(redis_client)
    bystanders = _bystanders(harness)
    victim = start_workflow(redis_client, compile_text("broken:A"), {}, "victim")
    result = Advancer(redis_client, KEYS).apply(_read_batch(redis_client))
    record = load_workflow(redis_client, KEYS, victim)
    assert record.status == "failed" and "WRONGTYPE" in (record.error or "")
    assert result.rejected and "Redis refused its commit" in result.rejected[0][1]
    _assert_bystanders_started(redis_client, bystanders)


def test_a_write_redis_refuses_in_the_script_fails_that_workflow_alone(
    harness: Harness, redis_client: redis.Redis
) -> None:
    _poison_stream(redis_client)
    bystanders = _bystanders(harness)
    victim = start_workflow(redis_client, compile_text("broken:A"), {}, "victim")
    ScriptOnly(redis_client, KEYS).apply(_read_batch(redis_client))
    record = load_workflow(redis_client, KEYS, victim)
    assert record.status == "failed" and "WRONGTYPE" in (record.error or "")
    _assert_bystanders_started(redis_client, bystanders)


def test_an_iteration_past_the_item_limit_fails_its_workflow_alone(
    harness: Harness, redis_client: redis.Redis
) -> None:
    victim = harness.submit(compile_text("* B"), list(range(5)), "wide")
    bystanders = _bystanders(harness)
    result = Advancer(redis_client, KEYS, limits=Limits(items=3)).apply(_read_batch(redis_client))
    record = load_workflow(redis_client, KEYS, victim)
    assert record.status == "failed" and "more than the limit of 3" in (record.error or "")
    assert record.starts == {}
    assert len(result.rejected) == 1
    _assert_bystanders_started(redis_client, bystanders)


def test_the_worker_command_takes_its_limits_from_flags() -> None:
    from lifecycle.cli import build_parser
    from lifecycle.cli.worker import limits_from

    args = build_parser().parse_args(["worker", "--max-items", "7", "--guard-ms", "20"])
    limits = limits_from(args)
    assert (limits.items, limits.guard_ms, limits.depth) == (7, 20, Limits().depth)
    with pytest.raises(Exception, match="--max-items must be at least 1"):
        limits_from(build_parser().parse_args(["worker", "--max-items", "0"]))


def test_an_output_too_deep_to_store_fails_its_workflow_under_the_default_limits(
    harness: Harness, redis_client: redis.Redis
) -> None:
    victim = harness.submit(FLOW, {}, "deeper")
    harness.advance()
    start = decode(redis_client.xrange(KEYS.tasks("default"))[0][1])
    fields = {k: orjson.dumps(v) for k, v in ev.end_task(start, {}).items()}
    fields["output"] = b"[" * 300 + b"1" + b"]" * 300  # JSON that orjson cannot write back
    redis_client.xadd(KEYS.lifecycle, fields)  # type: ignore[arg-type]
    Advancer(redis_client, KEYS).apply(_read_batch(redis_client))
    record = load_workflow(redis_client, KEYS, victim)
    assert record.status == "failed" and "output cannot be stored" in (record.error or "")
