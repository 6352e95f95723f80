"""Workers serving every kind follow kinds that appear after they start; the simulator
runs every example flow to its end."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle.submit import start_workflow
from tests.conftest import wait_until
from tests.processes import Processes
from tests.workers.helpers import KEYS, Threads, submit, wait_for_end
from workers.noop import NoopWorker, SimulatedWorker
from workers.wait import WaitWorker

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.flow"))


def _options(threads: Threads) -> dict:
    return {"pool": threads.pool, "handle_signals": False, "block_ms": 50}


def test_a_noop_worker_of_every_kind_serves_kinds_that_appear_after_it_started(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    worker = threads.start(NoopWorker(None, discover_every=0.05, **_options(threads)))
    wait_until(lambda: worker.established, what="the worker listening")
    assert worker.streams == (KEYS.tasks("default"),)
    workflow = submit(redis_client, "fresh:a → later:b → C", {"n": 1})
    assert wait_for_end(redis_client, workflow) == {"status": "finished", "output": {"n": 1}}
    assert set(worker.streams) == {KEYS.tasks(k) for k in ("default", "fresh", "later")}


def test_built_in_kinds_are_not_followed_by_a_worker_of_every_kind(
    redis_client: redis.Redis, threads: Threads
) -> None:
    redis_client.sadd(KEYS.kinds, "wait", "mine")
    worker = threads.start(NoopWorker(None, discover_every=0.05, **_options(threads)))
    wait_until(lambda: KEYS.tasks("mine") in worker.streams, what="the kind mine followed")
    assert KEYS.tasks("wait") not in worker.streams


@pytest.mark.parametrize("flow", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_simulate_runs_the_example_to_completion(
    flow: Path, redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    threads.start(WaitWorker(poll_interval=0.02, **_options(threads)))
    threads.start(
        SimulatedWorker(None, delay_max=0, seed=1, discover_every=0.05, **_options(threads))
    )
    workflow = start_workflow(redis_client, compile_text(flow.read_text(), str(flow)))
    final = wait_for_end(redis_client, workflow, timeout=20)
    assert final["status"] == "finished", final


def test_simulated_outputs_feed_an_iteration_a_list_and_merge_a_fan_outs_join(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    threads.start(
        SimulatedWorker(None, delay_max=0, seed=1, discover_every=0.05, **_options(threads))
    )
    flow = "split → * grow → keep → { left  right } → total"
    workflow = submit(redis_client, flow, {"batch": 7, "xs": [{"a": 1}, {"a": 2}]})
    final = wait_for_end(redis_client, workflow)
    # split: the items, each with the batch; grow: each item, done extended; keep: the
    # iteration's list as is; total: one object from the fan-out's join.
    assert final == {
        "status": "finished",
        "output": {"batch": 7, "a": 2, "done": ["grow", "total"]},
    }


def test_python_m_workers_simulate_serves_a_kind_submitted_after_it_started(
    redis_client: redis.Redis, processes: Processes
) -> None:
    processes.start("lifecycle", "worker", "--consumer", "lc")
    processes.start("workers", "simulate", "--delay-max", "0", "--consumer", "sim")
    wait_until(
        lambda: any(g["name"] == b"workers" for g in _groups(redis_client, KEYS.tasks("default"))),
        timeout=20,
        what="the simulator listening",
    )
    workflow = submit(redis_client, "brand-new:step", {"n": 1})
    final = wait_for_end(redis_client, workflow, timeout=20)
    assert final["status"] == "finished"
    assert final["output"] == {"n": 1, "done": ["brand-new:step"]}


def _groups(client: redis.Redis, stream: str) -> list[dict]:
    try:
        return client.xinfo_groups(stream)
    except redis.ResponseError:
        return []
