"""examples/: the seed-style worker runs examples/restock.flow with the built-ins."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from examples.seed_worker import StockListener
from flowlang.compiler import compile_text
from lifecycle.submit import start_workflow
from tests.conftest import wait_until
from tests.workers.helpers import KEYS, Threads, events, state, wait_for_end
from workers.runner import build_listener, load_listener_class
from workers.wait import WaitWorker

FLOW = Path(__file__).parents[2] / "examples" / "restock.flow"


def test_the_restock_example_runs_end_to_end_with_latches_a_guard_a_join_and_a_delay(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    options = {"pool": threads.pool, "handle_signals": False, "block_ms": 100}
    threads.start(WaitWorker(poll_interval=0.02, **options))
    cls = load_listener_class("examples.seed_worker:StockListener")
    assert cls is StockListener
    threads.start(build_listener(cls, keys=KEYS, pool=threads.pool, consumer="stock-0"))
    graph = compile_text(FLOW.read_text(), str(FLOW))
    started = time.monotonic()
    workflow = start_workflow(redis_client, graph)
    wait_until(lambda: redis_client.get(KEYS.latch("restock-42")) == b"1", what="the latch")
    waiter = start_workflow(redis_client, compile_text("wait:countdown (- name: restock-42 -)"))
    final = wait_for_end(redis_client, workflow)
    assert final == {
        "status": "finished",
        "output": {"batch": 42, "checked": 4, "reordered": ["b2", "d4"]},
    }
    assert time.monotonic() - started >= 1.0  # the delay
    assert wait_for_end(redis_client, waiter)["status"] == "finished"
    assert state(redis_client, waiter)["output"] == {}
    started_names = {
        (e["workflow"], e["key"]): e["name"]
        for kind in ("stock", "wait")
        for _, e in events(redis_client, KEYS.tasks(kind), "start-task")
    }
    ends = [e for _, e in events(redis_client, KEYS.lifecycle, "end-task")]
    names = [started_names[e["workflow"], e["key"]] for e in ends]
    assert names.count("stock:count") == 4 and names.count("stock:reorder") == 2
    assert names.index("wait:countdown") == names.index("wait:release") + 1
