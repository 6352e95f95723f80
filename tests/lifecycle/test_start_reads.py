"""What the lifecycle reads to apply a start-workflow. A start alone of an id it may not
know asks the workflows index only (ZSCORE): the index lists every id with a record or a
compacted one. An id the index lists is read whole, as before; so is a start whose id its
sender claimed in the index (start_once.lua, schedules: ``claimed`` in the event)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.engine.advance import Advancer
from lifecycle.engine.commit import Commit, shared_keys
from lifecycle.errors import BadEvent
from lifecycle.keys import Keys
from lifecycle.submit import start_workflow_once
from tests.lifecycle.harness import Harness, decode

GRAPH = compile_text("A → B")


def calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}


def reads_of(harness: Harness) -> dict[str, int]:
    """One lifecycle batch; the read commands it sent, by name."""
    before = calls(harness.client)
    harness.advance()
    after = calls(harness.client)
    return {
        name: after.get(name, 0) - before.get(name, 0)
        for name in ("zscore", "hmget", "hexists", "hgetall")
    }


def start_tasks(client: redis.Redis) -> list[str]:
    """The workflows of the start-tasks sent, in order."""
    return [decode(f)["workflow"] for _, f in client.xrange(Keys().tasks("default"))]


def test_a_batch_of_new_starts_asks_the_index_alone(harness: Harness) -> None:
    for n in range(20):
        harness.submit(GRAPH, {"n": n}, f"wf-{n}")
    assert reads_of(harness) == {"zscore": 20, "hmget": 0, "hexists": 0, "hgetall": 0}
    assert sorted(start_tasks(harness.client)) == sorted(f"wf-{n}" for n in range(20))


def test_a_start_of_a_running_id_is_read_whole_and_is_a_duplicate(harness: Harness) -> None:
    harness.submit(GRAPH, None, "wf")
    harness.advance()
    harness.submit(GRAPH, None, "wf")
    assert reads_of(harness) == {"zscore": 1, "hmget": 1, "hexists": 1, "hgetall": 0}
    assert start_tasks(harness.client) == ["wf"]
    assert harness.client.xpending(Keys().lifecycle, Keys().lifecycle_group)["pending"] == 0


def test_an_id_the_index_lists_without_a_record_starts(harness: Harness) -> None:
    """An id start_once.lua claimed, whose start came without the ``claimed`` hint."""
    harness.client.zadd(Keys().workflows, {"wf": 1})
    harness.submit(GRAPH, None, "wf")
    harness.advance()
    assert start_tasks(harness.client) == ["wf"]
    assert harness.client.hget(Keys().workflow("wf"), "g") is not None


def test_a_claimed_start_reads_its_record_and_compacted_entry_in_one_round(
    harness: Harness,
) -> None:
    harness.submit(GRAPH, None, "other")  # (registers the task stream's group)
    harness.advance()
    assert start_workflow_once(harness.client, GRAPH, None, "wf", harness.keys)
    (_, fields), *_ = harness.client.xrevrange(harness.keys.lifecycle, count=1)
    assert decode(fields)["claimed"] is True
    assert reads_of(harness) == {"zscore": 0, "hmget": 1, "hexists": 1, "hgetall": 0}
    assert start_tasks(harness.client) == ["other", "wf"]


class _RacedBy(Advancer):
    """Applies the entries ``rival`` is given right after this advancer's first read, as
    another lifecycle worker would between that read and the commit."""

    def __init__(self, client: redis.Redis, rival: Advancer) -> None:
        super().__init__(client, Keys())
        self.rival = rival
        self.rival_entries: list[tuple[str, dict[str, Any]]] = []

    def _load(self, pending: Any, send: Any, watch: bool) -> None:
        super()._load(pending, send, watch)
        if self.rival_entries:
            entries, self.rival_entries = self.rival_entries, []
            assert self.rival.apply(entries).committed == 1


def test_a_start_applied_elsewhere_after_the_index_was_asked_is_not_run_twice(
    harness: Harness, redis_client: redis.Redis
) -> None:
    keys = Keys()
    harness.submit(GRAPH, {"n": 1}, "wf")
    harness.submit(GRAPH, {"n": 2}, "wf")
    reply = redis_client.xreadgroup(keys.lifecycle_group, "x", {keys.lifecycle: ">"}, count=2)
    (first, first_fields), (second, second_fields) = reply[0][1]
    raced = _RacedBy(redis_client, Advancer(redis_client, keys))
    raced.rival_entries = [(second.decode(), decode(second_fields))]
    result = raced.apply([(first.decode(), decode(first_fields))])
    assert (result.committed, len(result.duplicates)) == (0, 1)
    assert start_tasks(redis_client) == ["wf"]
    # the rival's run, and the only one
    assert orjson.loads(redis_client.hget(keys.workflow("wf"), rec.INPUT)) == {"n": 2}


def test_a_commit_refused_midway_in_advance_lua_leaves_the_record_it_wrote_listed(
    redis_client: redis.Redis,
) -> None:
    """Redis keeps what a script wrote before a refused write: the index entry goes
    first, so a start alone never takes that record for none."""
    keys = Keys()
    redis_client.set(keys.tasks("broken"), "not a stream")
    commit = Commit(keys, "victim", shared_keys(keys))
    commit.created = "1000"
    commit.set(rec.VERSION, 1)
    commit.append(keys.tasks("broken"), {"kind": ev.START_TASK})
    call_keys, args = commit.script_call(keys.lifecycle_group, "")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        Advancer(redis_client, keys).script(keys=call_keys, args=args)
    assert redis_client.hget(keys.workflow("victim"), rec.VERSION) == b"1"
    assert redis_client.zscore(keys.workflows, "victim") == 1000


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_claimed_field_that_is_not_true_or_false_is_a_bad_event(value: Any) -> None:
    event = ev.start_workflow("wf", "g" * 64, None)
    event["claimed"] = value
    with pytest.raises(BadEvent, match=r"event 1-0 \(start-workflow\): field 'claimed'"):
        ev.parse_start_workflow("1-0", orjson.loads(orjson.dumps(event)))


def test_start_workflow_writes_claimed_only_when_true() -> None:
    assert "claimed" not in ev.start_workflow("wf", "g", None)
    assert ev.start_workflow("wf", "g", None, claimed=True)["claimed"] is True
