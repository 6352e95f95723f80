"""Real processes: several lifecycle and task workers, and lifecycle workers killed with SIGKILL.

Each test submits 1,000 workflows with joins, a subflow and iteration, then
checks from Redis alone: every workflow finished with the in-memory runner's
output, exactly one end-workflow event each, and every task attempt started
exactly once.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable

import orjson
import redis

from flowlang.compiler import compile_text
from flowlang.runner import run
from lifecycle.keys import Keys
from lifecycle.submit import start_workflow
from tests.processes import Processes, wait_until_all_ended

FLOW = "A :x → * { B → C } → :y D; :x → E → :y; D → F|G"
WORKFLOWS = 1000
KEYS = Keys()


def submit_all(client: redis.Redis) -> tuple[list[str], object]:
    graph = compile_text(FLOW)
    ids = [start_workflow(client, graph, [i, i + 1, i + 2], f"w{i}") for i in range(WORKFLOWS)]
    expected = {
        f"w{i}": run(graph, lambda c: c.input, [i, i + 1, i + 2]).output for i in range(WORKFLOWS)
    }
    return ids, expected


def check_exactly_once(client: redis.Redis, states: dict, expected: dict) -> None:
    assert {w: s.get("output") for w, s in states.items()} == expected
    ends = Counter()
    for _, fields in client.xrange(KEYS.lifecycle):
        if orjson.loads(fields[b"kind"]) in ("end-workflow", "failed-workflow"):
            ends[orjson.loads(fields[b"workflow"])] += 1
    assert set(ends) == set(expected) and set(ends.values()) == {1}
    starts = Counter(orjson.loads(f[b"id"]) for _, f in client.xrange(KEYS.tasks("default")))
    assert starts and max(starts.values()) == 1
    calls = len(run(compile_text(FLOW), lambda c: c.input, [0, 1, 2]).calls)
    assert len(starts) == calls * len(expected)  # no task instance missing either


def test_three_lifecycle_and_four_task_workers_run_each_task_once(
    processes: Processes, redis_client: redis.Redis
) -> None:
    ids, expected = submit_all(redis_client)
    for n in range(3):
        processes.lifecycle(f"lifecycle-{n}")
    for n in range(4):
        processes.noop(f"noop-{n}")
    states = wait_until_all_ended(redis_client, ids, timeout=120)
    check_exactly_once(redis_client, states, expected)


def test_a_lifecycle_worker_killed_again_and_again_loses_and_repeats_nothing(
    processes: Processes, redis_client: redis.Redis
) -> None:
    ids, expected = submit_all(redis_client)
    steady = processes.lifecycle("steady", claim_idle=1.0)
    victim = [processes.lifecycle("victim", claim_idle=1.0)]
    for n in range(2):
        processes.noop(f"noop-{n}")
    chance = random.Random(7)
    kills = [0]
    next_kill = [time.monotonic() + chance.uniform(0.1, 0.3)]

    def kill_and_restart() -> None:
        if time.monotonic() < next_kill[0]:
            return
        victim[0].kill()  # SIGKILL: no cleanup, events in hand stay pending
        victim[0].wait()
        kills[0] += 1
        victim[0] = processes.lifecycle("victim", claim_idle=1.0)
        next_kill[0] = time.monotonic() + chance.uniform(0.1, 0.3)

    states = wait_until_all_ended(redis_client, ids, timeout=180, during=kill_and_restart)
    assert kills[0] >= 2, "the run ended before the worker was killed twice"
    assert steady.poll() is None
    check_exactly_once(redis_client, states, expected)


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.2)


def _all_applied(client: redis.Redis) -> bool:
    groups = client.xinfo_groups(KEYS.lifecycle)
    (group,) = [g for g in groups if g["name"].decode() == KEYS.lifecycle_group]
    return group["pending"] == 0 and group["lag"] == 0


def test_an_id_sent_again_and_again_to_three_lifecycle_workers_runs_once_compacted_or_not(
    processes: Processes, redis_client: redis.Redis
) -> None:
    """Each start of an id not yet known asks the index alone, under the WATCH of its
    record: three workers racing on copies of it run it once, and copies sent once it
    finished and was compacted start nothing."""
    graph = compile_text("A → B")
    ids = [f"d{i}" for i in range(300)]
    sends = [(workflow, copy) for workflow in ids for copy in range(3)]
    random.Random(3).shuffle(sends)
    for n in range(3):
        processes.start("lifecycle", "worker", "--consumer", f"lc-{n}", "--keep-details", "0")
    for n in range(2):
        processes.noop(f"noop-{n}")
    for workflow, copy in sends:
        start_workflow(redis_client, graph, {"copy": copy}, workflow)

    def finished() -> int:
        return int(redis_client.hget(KEYS.outcomes, "finished") or 0)

    _wait_for(lambda: finished() == len(ids), 120, "every workflow finished")
    ends = Counter(
        orjson.loads(fields[b"workflow"])
        for _, fields in redis_client.xrange(KEYS.lifecycle)
        if orjson.loads(fields[b"kind"]) == "end-workflow"
    )
    assert set(ends) == set(ids) and set(ends.values()) == {1}
    starts = Counter(orjson.loads(f[b"id"]) for _, f in redis_client.xrange(KEYS.tasks("default")))
    assert len(starts) == 2 * len(ids) and set(starts.values()) == {1}

    _wait_for(lambda: redis_client.hlen(KEYS.compacted) == len(ids), 30, "all compacted")
    sent = redis_client.xlen(KEYS.tasks("default"))
    for workflow in ids:
        start_workflow(redis_client, graph, {"copy": 9}, workflow)
    _wait_for(lambda: _all_applied(redis_client), 30, "the copies applied")
    assert redis_client.xlen(KEYS.tasks("default")) == sent
    assert finished() == len(ids) and redis_client.hlen(KEYS.compacted) == len(ids)
