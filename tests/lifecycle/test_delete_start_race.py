"""A delete and a later start of the same id, applied by two lifecycle workers at once."""

from __future__ import annotations

from typing import Any

import orjson
import redis

from flowlang.compiler import compile_text
from flowlang.graph import Graph
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.engine.advance import Advancer
from lifecycle.engine.commit import Pending
from lifecycle.keys import Keys
from lifecycle.submit import start_workflow
from rqse import EventClient
from tests.lifecycle.harness import Harness
from tests.lifecycle.test_compact_record import CHAIN, HOUR, compacting, run_and_compact
from tests.lifecycle.test_compact_record import ok as compact_ok
from tests.lifecycle.test_max_running_direct import Racing, ok, read_batch

KEYS = Keys()


def delete_then_start(client: redis.Redis, graph: Graph, input: Any) -> tuple[Any, Any]:
    """A delete of "w" and a start of "w" right behind it, both read from the lifecycle
    stream (as one worker and another would read them), not applied yet."""
    EventClient(KEYS.lifecycle, pool=client.connection_pool).append(
        ev.control(ev.DELETE_WORKFLOW, "w")
    )
    (delete,) = read_batch(client)
    start_workflow(client, graph, input, "w", KEYS)
    (start,) = read_batch(client)
    return delete, start


def other_worker(client: redis.Redis) -> Advancer:
    """A second lifecycle worker's advancer, on its own connections."""
    return Advancer(redis.Redis(connection_pool=client.connection_pool), KEYS)


def test_a_start_judged_a_duplicate_while_a_delete_commits_is_judged_again_and_runs(
    harness: Harness,
) -> None:
    graph = compile_text("A")
    harness.submit(graph, None, "w")
    harness.pump(ok)  # finished: a second start is a duplicate
    delete, start = delete_then_start(harness.client, graph, {"again": True})
    # This worker loads w (still there, finished), judges the start a duplicate; another
    # worker commits the delete before this one acknowledges that judgement.
    racing = Racing(harness.client, KEYS)
    other = other_worker(harness.client)
    racing.intrude = lambda: other.apply([delete])
    result = racing.apply([start])
    assert result.committed == 1 and result.duplicates == []
    state = orjson.loads(harness.client.hget(KEYS.workflow("w"), rec.STATE))
    assert state["status"] == "running"
    harness.pump(ok)
    assert orjson.loads(harness.client.hget(KEYS.workflow("w"), rec.STATE))["status"] == "finished"


class RacingTwice(Racing):
    """``intrude`` before its watched round's commit; ``intrude_later`` once the next
    round (after the first lost its race) has read ``later_for``, before it judges it."""

    intrude_later: Any = None
    later_for = ""

    def _compute(self, item: Pending, now: int, send: Any) -> Any:
        if item.workflow == self.later_for and self.intrude is None and self.intrude_later:
            intrude, self.intrude_later = self.intrude_later, None
            intrude()
        return super()._compute(item, now, send)


def test_a_start_judged_a_duplicate_after_a_lost_race_while_a_delete_commits_runs(
    harness: Harness,
) -> None:
    graph = compile_text("A")
    harness.submit(graph, None, "w")
    harness.submit(graph, None, "y")
    harness.pump(ok)
    harness.submit(compile_text("A → B"), None, "z")
    harness.advance()
    harness.work(ok)  # z's answer for A waits on the stream
    (answer,) = read_batch(harness.client)
    delete, start = delete_then_start(harness.client, graph, {"again": True})
    racing = RacingTwice(harness.client, KEYS)
    other = other_worker(harness.client)
    # The batch's watched round loses (z changed meanwhile): the next round judges the
    # start a duplicate again, and the delete commits before that judgement is acted on.
    racing.intrude = lambda: harness.client.hset(KEYS.workflow("z"), "touched", 1)
    racing.intrude_later, racing.later_for = lambda: other.apply([delete]), "w"
    result = racing.apply([start, answer])
    assert result.duplicates == [] and result.committed == 2
    harness.pump(ok)
    assert orjson.loads(harness.client.hget(KEYS.workflow("w"), rec.STATE))["status"] == "finished"
    assert harness.client.xpending(KEYS.lifecycle, KEYS.lifecycle_group)["pending"] == 0


def test_a_start_of_a_compacted_id_judged_a_duplicate_while_a_delete_commits_runs(
    redis_client: redis.Redis,
) -> None:
    harness = compacting(redis_client)
    run_and_compact(harness, "w")  # finished and compacted: a second start is a duplicate
    delete, start = delete_then_start(redis_client, CHAIN, {"n": 0})
    # Judged a duplicate by its compacted entry, which no WATCH covers; the delete
    # removes that entry before the judgement is acted on.
    racing = Racing(redis_client, KEYS, retain_ms=HOUR, keep_details_ms=0)
    other = other_worker(redis_client)
    racing.intrude = lambda: other.apply([delete])
    result = racing.apply([start])
    assert result.duplicates == [] and result.committed == 1
    harness.pump(compact_ok)
    state = orjson.loads(redis_client.hget(KEYS.workflow("w"), rec.STATE))
    assert state["status"] == "finished"
