"""A compacted finished workflow is one entry of a shared hash ({flow}:compacted, id ->
record) whose removal is listed in due order ({flow}:expiring-compacted): readers see it
exactly as they saw the hash compaction used to leave, which still reads and expires the
same."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall
from flowstream.api.views import workflow_view
from lifecycle import compact
from lifecycle import records as rec
from lifecycle.client import Client
from lifecycle.engine.advance import Advancer
from lifecycle.engine.retention import retention_pump
from lifecycle.errors import NotAllowed
from lifecycle.events import end_task
from lifecycle.history import inspected
from lifecycle.inspect import describe_workflow, list_page
from lifecycle.keys import TASK_GROUP, Keys
from lifecycle.schedules import Schedule, Schedules, run_id
from lifecycle.status import count_workflows
from lifecycle.submit import start_workflow
from tests.lifecycle.harness import Harness

KEYS = Keys()
HOUR = 3_600_000
CHAIN = compile_text("@flow chained\n" + " → ".join(f"T{n}" for n in range(5)))


def ok(call: TaskCall) -> Any:
    return {"n": call.input.get("n", 0) + 1, "note": "x" * 80}


def compacting(client: redis.Redis, retain_ms: int = HOUR) -> Harness:
    harness = Harness(client, KEYS)
    harness.advancer = Advancer(client, KEYS, retain_ms=retain_ms, keep_details_ms=0)
    return harness


def run_and_compact(harness: Harness, workflow_id: str) -> int:
    """Run ``workflow_id`` to its end and compact it; its end time (ms)."""
    harness.submit(CHAIN, {"n": 0, "text": "é" * 40}, workflow_id)
    harness.pump(ok)
    ended = int(harness.client.hget(KEYS.workflow(workflow_id), rec.ENDED) or 0)
    assert retention_pump(harness.client, KEYS).fire_due(ended) >= 1
    assert harness.client.hexists(KEYS.compacted, workflow_id)
    assert not harness.client.exists(KEYS.workflow(workflow_id))
    return ended


def to_old_form(client: redis.Redis, workflow_id: str) -> None:
    """What compaction left before the string: the hash less its task records, with
    its version, attempt salt and compaction time."""
    [found] = compact.read_compacted(client, KEYS, [workflow_id])
    assert found is not None
    fields = {**found, b"v": b"7", b"t": b"0123456789abcdef0123456789abcdef"}
    client.hdel(KEYS.compacted, workflow_id)
    client.hset(KEYS.workflow(workflow_id), mapping=fields)  # type: ignore[arg-type]


def views(client: redis.Redis, workflow_id: str) -> dict[str, Any]:
    """What inspect, list, the API and the control commands show of the workflow."""
    status = Client(client, KEYS).status(workflow_id)
    return {
        "inspect": describe_workflow(client, KEYS, workflow_id, now_ms=0),
        "api": workflow_view(inspected(client, KEYS, workflow_id)),
        "list": list_page(client, KEYS, state="finished", flow="chained", graphs=None)[0],
        "status": (status.state, status.ended, status.flow, status.restartable, status.error),
    }


def test_inspect_list_api_and_status_show_the_string_as_they_showed_the_old_hash(
    redis_client: redis.Redis,
) -> None:
    run_and_compact(compacting(redis_client), "wf")
    new = views(redis_client, "wf")
    assert new["inspect"]["output"]["n"] == 5 and new["inspect"]["input"]["text"] == "é" * 40
    assert new["inspect"]["state"] == "finished" and new["inspect"]["flow"] == "chained"
    assert new["inspect"]["compacted"] is not None and new["list"][0]["id"] == "wf"
    to_old_form(redis_client, "wf")
    assert views(redis_client, "wf") == new


def test_the_record_is_its_input_and_output_and_a_few_bytes_more(
    redis_client: redis.Redis,
) -> None:
    run_and_compact(compacting(redis_client), "wf")
    record: Any = redis_client.hget(KEYS.compacted, "wf")
    described = describe_workflow(redis_client, KEYS, "wf")
    data = len(orjson.dumps(described["input"])) + len(orjson.dumps(described["output"]))
    # the flow's name (7), a graph's short name, four times in base 36, separators
    assert len(record) <= data + 7 + 36, record


def test_an_old_form_compacted_workflow_is_still_removed_on_time(
    redis_client: redis.Redis,
) -> None:
    ended = run_and_compact(compacting(redis_client), "wf")
    to_old_form(redis_client, "wf")
    redis_client.delete(KEYS.expiring_compacted, KEYS.expiring_compacted_last)
    redis_client.zadd(KEYS.expiring, {"wf": ended + HOUR})  # as compaction scheduled it
    pump = retention_pump(redis_client, KEYS)
    assert pump.fire_due(ended + HOUR - 1) == 0
    assert Client(redis_client, KEYS).status("wf").state == "finished"
    assert pump.fire_due(ended + HOUR) == 1
    assert not redis_client.exists(KEYS.workflow("wf"), KEYS.expiring)
    assert redis_client.zcard(KEYS.workflows) == 0


def test_a_removal_due_before_the_last_listed_one_is_scheduled_exactly(
    redis_client: redis.Redis,
) -> None:
    late = run_and_compact(compacting(redis_client, 2 * HOUR), "late") + 2 * HOUR
    early = run_and_compact(compacting(redis_client, HOUR), "early") + HOUR
    assert early < late
    [listed] = redis_client.lrange(KEYS.expiring_compacted, 0, -1)
    assert listed.startswith(b"late ")
    assert redis_client.zscore(KEYS.expiring, "early") == early
    counts = count_workflows(redis_client, KEYS)
    assert (counts.expiring, counts.next_removal_ms) == (2, early)
    pump = retention_pump(redis_client, KEYS)
    assert pump.fire_due(early) == 1
    assert redis_client.hkeys(KEYS.compacted) == [b"late"]
    assert pump.fire_due(late) == 1
    assert redis_client.zcard(KEYS.workflows) == 0
    assert not redis_client.exists(KEYS.compacted, KEYS.expiring_compacted)


def test_a_deleted_compacted_workflow_goes_and_its_listed_removal_spares_the_next_one(
    redis_client: redis.Redis,
) -> None:
    harness = compacting(redis_client)
    first = run_and_compact(harness, "wf") + HOUR
    Client(redis_client, KEYS).delete("wf")
    harness.advance()
    assert not redis_client.exists(KEYS.workflow("wf"), KEYS.compacted)
    assert redis_client.zcard(KEYS.workflows) == 0
    time.sleep(0.005)  # the same id again, ending later
    second = run_and_compact(harness, "wf") + HOUR
    assert second > first
    # The deleted one's entry, at the head with no record of its own, went meanwhile.
    assert redis_client.llen(KEYS.expiring_compacted) == 1
    pump = retention_pump(redis_client, KEYS)
    assert pump.fire_due(first) == 0
    assert Client(redis_client, KEYS).status("wf").state == "finished"
    assert pump.fire_due(second) == 1
    assert not redis_client.exists(KEYS.compacted, KEYS.expiring_compacted)


def test_a_compacted_workflow_cannot_be_restarted(redis_client: redis.Redis) -> None:
    run_and_compact(compacting(redis_client), "wf")
    with pytest.raises(NotAllowed):
        Client(redis_client, KEYS).restart("wf")


def test_a_late_answer_for_a_compacted_workflow_changes_nothing(
    redis_client: redis.Redis,
) -> None:
    harness = compacting(redis_client)
    run_and_compact(harness, "wf")
    packed = redis_client.hget(KEYS.compacted, "wf")
    redis_client.xadd(
        KEYS.lifecycle,
        {"kind": b'"end-task"', "workflow": b'"wf"', "key": b'"T0"', "output": b"{}"},
    )
    harness.advance()
    assert redis_client.hget(KEYS.compacted, "wf") == packed
    assert not redis_client.exists(KEYS.workflow("wf"))


def test_a_state_of_status_and_output_only_keeps_the_output_bare(
    redis_client: redis.Redis,
) -> None:
    run_and_compact(compacting(redis_client), "wf")
    packed: Any = redis_client.hget(KEYS.compacted, "wf")
    assert packed[:1] == compact.OUTPUT_ONLY and b'"status"' not in packed
    state = compact.fields(packed, None)[rec.STATE.encode()]
    assert orjson.loads(state) == {"status": "finished", "output": {"n": 5, "note": "x" * 80}}


def test_a_state_with_more_than_its_output_is_kept_whole() -> None:
    state = b',"attempts":{"T0":2},"output":[1,2]}'
    packed = b"1b,rs,k,3,,4\nnamed\n{}\n" + state
    assert compact.removal_due(packed) is None
    assert compact.graph_ref(packed) == b"b"
    assert compact.fields(packed, b"digest") == {
        b"created": b"1000",
        b"ended": b"1020",
        b"c": b"1023",
        b"g": b"digest",
        b"name": b"named",
        b"input": b"{}",
        b"s": b'{"status":"finished"' + state,
        b"priority": b"4",
    }


def test_a_value_that_is_no_compacted_record_reads_as_a_corrupt_state() -> None:
    assert compact.fields(b"9garbage", None) == {b"s": b"9garbage"}
    assert compact.fields(b"1a,b\n\n{}\n}", None) == {b"s": b"1a,b\n\n{}\n}"}


def test_a_schedules_last_run_compacted_within_the_minute_does_not_block_the_next(
    redis_client: redis.Redis,
) -> None:
    graph = compile_text("@flow quick\nstep\n", "t.flow")
    schedules = Schedules(redis_client, KEYS)
    schedule = Schedule(
        name="s", graph=graph.content_hash(), flow="quick", file="t.flow", every_ms=20_000
    )
    first = schedules.add(schedule, graph, now_ms=0)
    harness = compacting(redis_client)
    redis_client.xgroup_create(KEYS.tasks("default"), TASK_GROUP, id="0", mkstream=True)
    harness.kinds.add("default")
    assert schedules.fire_due(first) == 1
    harness.pump(ok)
    one = run_id("s", first)
    ended = int(redis_client.hget(KEYS.workflow(one), rec.ENDED) or 0)
    assert retention_pump(redis_client, KEYS).fire_due(ended) >= 1
    assert redis_client.hexists(KEYS.compacted, one)
    # Its overlap policy is skip: a run still going would make this fire time start nothing.
    assert schedules.fire_due(first + 20_000) == 1


def test_a_large_output_a_priority_and_no_flow_name_read_back_whole(
    redis_client: redis.Redis,
) -> None:
    harness = compacting(redis_client)
    graph = compile_text("A → B")
    redis_client.xgroup_create(KEYS.tasks("default", 3), TASK_GROUP, id="0", mkstream=True)
    harness.kinds.add("default")
    start_workflow(redis_client, graph, {"n": 0}, "big", KEYS, priority=3)
    for _ in range(20):  # the harness reads kind streams of priority 0 only
        harness.advance()
        reply: Any = redis_client.xreadgroup(TASK_GROUP, "t", {KEYS.tasks("default", 3): ">"})
        for _, items in reply or []:
            for _, fields in items:
                event = {k.decode(): orjson.loads(v) for k, v in fields.items()}
                answer = end_task(event, {"text": "y" * 5000}, worker="t")
                redis_client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in answer.items()})
    ended = int(redis_client.hget(KEYS.workflow("big"), rec.ENDED) or 0)
    before = describe_workflow(redis_client, KEYS, "big", now_ms=0)
    assert before["state"] == "finished" and before["priority"] == 3
    assert retention_pump(redis_client, KEYS).fire_due(ended) == 1
    assert redis_client.hget(KEYS.compacted, "big")[:1] == compact.FORMAT  # type: ignore[index]
    after = describe_workflow(redis_client, KEYS, "big", now_ms=0)
    assert after["output"] == {"text": "y" * 5000} and after["flow"] is None
    assert {k: v for k, v in after.items() if k not in ("tasks", "compacted")} == {
        k: v for k, v in before.items() if k not in ("tasks", "compacted")
    }


def test_a_workflow_under_a_concurrency_key_stays_a_hash_less_its_task_records(
    redis_client: redis.Redis,
) -> None:
    harness = compacting(redis_client)
    graph = compile_text("A → B")
    redis_client.xgroup_create(KEYS.tasks("default"), TASK_GROUP, id="0", mkstream=True)
    harness.kinds.add("default")
    start_workflow(redis_client, graph, {}, "keyed", KEYS, concurrency_key="k", max_running=1)
    harness.pump(ok)
    ended = int(redis_client.hget(KEYS.workflow("keyed"), rec.ENDED) or 0)
    assert retention_pump(redis_client, KEYS).fire_due(ended) == 1
    names = set(redis_client.hkeys(KEYS.workflow("keyed")))  # type: ignore[arg-type]
    assert rec.CONCURRENCY.encode() in names and rec.COMPACTED.encode() in names
    assert not any(name.startswith((b"n:", b"o:")) for name in names)
    assert not redis_client.hexists(KEYS.compacted, "keyed")
    assert redis_client.zscore(KEYS.expiring, "keyed") == ended + HOUR
