"""The task contract against a real Redis: TaskListener and the seed's raw style, end to end."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
import redis

from lifecycle.submit import terminate_workflow
from lifecycle.worker import LifecycleWorker
from tests.conftest import wait_until
from tests.rqse.seed_sleep_listener import SleepListener
from tests.workers.helpers import KEYS, Threads, events, submit, wait_for_end
from workers import Task, TaskListener


class Upper(TaskListener):
    kind = "text"

    def run(self, task: Task) -> Any:
        if task.input.get("t") == "boom":
            raise ValueError(f"cannot shout {task.input['t']!r}")
        return {"t": task.input["t"].upper(), "by": task.operation, "key": task.key}


def test_a_task_listener_runs_a_workflow_with_iteration_end_to_end(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    worker = threads.start(Upper(pool=threads.pool, handle_signals=False, block_ms=100))
    workflow = submit(redis_client, '<[{"t": "a"}, {"t": "b"}]> → * text:shout')
    final = wait_for_end(redis_client, workflow)
    assert final["status"] == "finished"
    assert final["output"] == [
        {"t": "A", "by": "shout", "key": "2.0"},
        {"t": "B", "by": "shout", "key": "2.1"},
    ]
    ends = events(redis_client, KEYS.lifecycle, "end-task")
    assert {e["worker"] for _, e in ends} == {worker.consumer}
    starts = events(redis_client, KEYS.tasks("text"), "start-task")
    answered = {f"{e['workflow']}/{e['key']}/{e['attempt']}" for _, e in ends}
    assert answered == {e["id"] for _, e in starts} and len(ends) == len(starts)


def test_an_exception_in_run_fails_the_task_with_its_type_and_text(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    threads.start(Upper(pool=threads.pool, handle_signals=False, block_ms=100))
    workflow = submit(redis_client, "text:shout", {"t": "boom"})
    final = wait_for_end(redis_client, workflow)
    assert final["status"] == "failed"
    (_, end), *_ = events(redis_client, KEYS.lifecycle, "end-task")
    assert end["status"] == "FAILURE"
    assert end["error"] == "ValueError: cannot shout 'boom'"


class Slow(TaskListener):
    kind = "slow"

    def __init__(self, calls: list[str], **options: Any) -> None:
        super().__init__(**options)
        self.calls = calls

    def run(self, task: Task) -> Any:
        self.calls.append(self.consumer)
        time.sleep(2.0)  # more than three times claim_idle
        return {"slept": True}


def test_a_task_running_longer_than_claim_idle_is_not_claimed_by_a_live_peer(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    calls: list[str] = []
    options = {"pool": threads.pool, "handle_signals": False, "block_ms": 100, "claim_idle": 0.6}
    peers = [threads.start(Slow(calls, consumer=f"slow-{n}", **options)) for n in range(2)]
    workflow = submit(redis_client, "slow:nap")
    assert wait_for_end(redis_client, workflow)["status"] == "finished"
    assert len(calls) == 1
    assert sum(peer.stats.claimed for peer in peers) == 0
    assert sum(peer.stats.claim_scans for peer in peers) >= 4  # peers did look for idle work


class Patient(TaskListener):
    kind = "patient"
    cancel_check_interval = 0.05

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.started = threading.Event()
        self.noticed: list[float] = []

    def run(self, task: Task) -> Any:
        self.started.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if task.cancelled():
                self.noticed.append(time.monotonic())
                return None
            time.sleep(0.02)
        return {"gave": "up"}


def test_a_running_task_learns_that_its_workflow_was_terminated(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    worker = threads.start(Patient(pool=threads.pool, handle_signals=False, block_ms=100))
    workflow = submit(redis_client, "patient:wait")
    assert worker.started.wait(10)
    terminated_at = time.monotonic()
    terminate_workflow(redis_client, workflow)
    assert wait_for_end(redis_client, workflow)["status"] == "terminated"
    wait_until(lambda: worker.noticed, what="the task to notice")
    assert worker.noticed[0] - terminated_at < 2.0


class AskingCancelled(TaskListener):
    """Records what ``cancelled()`` says in each run."""

    kind = "asking"

    def __init__(self, said: list[bool], **options: Any) -> None:
        super().__init__(**options)
        self.said = said

    def run(self, task: Task) -> Any:
        self.said.append(task.cancelled())
        return {}


def test_a_task_of_a_workflow_with_chunked_state_is_not_cancelled_while_it_runs(
    redis_client: redis.Redis, threads: Threads
) -> None:
    said: list[bool] = []
    threads.lifecycle()
    threads.start(AskingCancelled(said, pool=threads.pool, handle_signals=False, block_ms=100))
    # A workflow with this many tasks running keeps each running instance as a field of
    # its own (a chunked state, lifecycle/stored_state.py).
    workflow = submit(redis_client, f"<{list(range(80))}> → * asking:work")
    assert wait_for_end(redis_client, workflow)["status"] == "finished"
    assert said == [False] * 80


def test_the_seeds_sleep_listener_runs_a_workflow_with_its_index_only_end_tasks(
    redis_client: redis.Redis, threads: Threads
) -> None:
    """The predecessor's SleepListener, unchanged: its end-task carries only workflow,
    name, index and status, and is appended to the listener's first stream — so it
    is given the lifecycle stream first and its kind's task stream second. Its answers
    carry no attempt token: the lifecycle worker takes them when told to."""
    threads.start(
        LifecycleWorker(
            pool=threads.pool, handle_signals=False, block_ms=100, untokened_answers=True
        )
    )
    kwargs = redis_client.connection_pool.connection_kwargs
    seed = SleepListener(
        [KEYS.lifecycle, KEYS.tasks("compute")],
        group="workers",
        host=kwargs["host"],
        port=kwargs["port"],
    )
    threads.start(seed)
    workflow = submit(redis_client, "compute:a (- for: 0 -) → compute:b (- for: 0 -)", {"x": 1})
    assert wait_for_end(redis_client, workflow)["status"] == "finished"
    ends = [e for _, e in events(redis_client, KEYS.lifecycle, "end-task")]
    assert [e["name"] for e in ends] == ["compute:a", "compute:b"]
    assert all("key" not in e and "attempt" not in e for e in ends)
    assert seed.stats.processed == 2
    seed.close()


class Refusing(TaskListener):
    kind = "resource"

    def run(self, task: Task) -> Any:
        raise ValueError("refused")


def test_a_failed_resource_task_is_logged_without_its_url_s_password(
    redis_client: redis.Redis, threads: Threads, caplog: pytest.LogCaptureFixture
) -> None:
    threads.lifecycle()
    threads.start(Refusing(pool=threads.pool, handle_signals=False, block_ms=100))
    with caplog.at_level(logging.INFO, logger="workers.task"):
        workflow = submit(redis_client, "<https://ann:hunter2@127.0.0.1/data.json> → done")
        assert wait_for_end(redis_client, workflow)["status"] == "failed"
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failed and all("hunter2" not in line for line in failed), failed
    assert any("https://ann:***@127.0.0.1/data.json" in line for line in failed), failed
