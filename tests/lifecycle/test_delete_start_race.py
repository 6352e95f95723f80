"""A delete and a later start of the same id, applied by two lifecycle workers at once."""

from __future__ import annotations

import orjson
import redis

from flowlang.compiler import compile_text
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.engine.advance import Advancer
from lifecycle.keys import Keys
from lifecycle.submit import start_workflow
from rqse import EventClient
from tests.lifecycle.harness import Harness
from tests.lifecycle.test_max_running_direct import Racing, ok, read_batch

KEYS = Keys()


def test_a_start_judged_a_duplicate_while_a_delete_commits_is_judged_again_and_runs(
    harness: Harness,
) -> None:
    graph = compile_text("A")
    harness.submit(graph, None, "w")
    harness.pump(ok)  # finished: a second start is a duplicate
    EventClient(KEYS.lifecycle, pool=harness.client.connection_pool).append(
        ev.control(ev.DELETE_WORKFLOW, "w")
    )
    (delete,) = read_batch(harness.client)
    start_workflow(harness.client, graph, {"again": True}, "w", KEYS)
    (start,) = read_batch(harness.client)
    # This worker loads w (still there, finished), judges the start a duplicate; another
    # worker commits the delete before this one acknowledges that judgement.
    racing = Racing(harness.client, KEYS)
    other = Advancer(redis.Redis(connection_pool=harness.client.connection_pool), KEYS)
    racing.intrude = lambda: other.apply([delete])
    result = racing.apply([start])
    assert result.committed == 1 and result.duplicates == []
    state = orjson.loads(harness.client.hget(KEYS.workflow("w"), rec.STATE))
    assert state["status"] == "running"
    harness.pump(ok)
    assert orjson.loads(harness.client.hget(KEYS.workflow("w"), rec.STATE))["status"] == "finished"
