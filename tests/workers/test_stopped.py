"""Start-tasks of attempts a failed or terminated workflow stopped are not run (Keys.stopped)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle.client import Client
from lifecycle.keys import Keys
from lifecycle.submit import start_workflow
from lifecycle.worker import LifecycleWorker
from tests.conftest import wait_until
from workers.noop import NoopWorker, SimulatedWorker
from workers.task import Task, TaskListener

KEYS = Keys()


def _start_task(workflow: str, key: str = "1") -> dict[bytes, bytes]:
    event = {
        "kind": "start-task",
        "workflow": workflow,
        "name": "A",
        "index": 1,
        "key": key,
        "attempt": 2,
        "id": f"{workflow}/{key}/2",
        "token": "t",
        "input": {"from": workflow},
        "parameters": {},
    }
    return {name.encode(): orjson.dumps(value) for name, value in event.items()}


def _answered(client: redis.Redis) -> list[str]:
    return [orjson.loads(f[b"workflow"]) for _, f in client.xrange(KEYS.lifecycle)]


def _options(client: redis.Redis) -> dict[str, Any]:
    return {"pool": client.connection_pool, "handle_signals": False, "block_ms": 50}


class Recording(TaskListener):
    kind = "default"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.ran: list[str] = []

    def run(self, task: Task) -> Any:
        self.ran.append(task.workflow)
        return {"ok": True}


@pytest.mark.parametrize(
    "make",
    [
        lambda options: NoopWorker(["default"], **options),
        lambda options: SimulatedWorker(["default"], delay_max=0, **options),
        lambda options: Recording(batch_size=10, **options),
    ],
    ids=["noop", "simulate", "task-listener"],
)
def test_start_tasks_of_ended_workflows_are_acknowledged_without_running_or_answer(
    make: Any, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    redis_client.hset(KEYS.stopped, "wf-ended", "{}")  # every attempt stopped
    for fields in (_start_task("wf-ended"), _start_task("wf-live"), _start_task("wf-ended", "2")):
        redis_client.xadd(KEYS.tasks("default"), fields)  # type: ignore[arg-type]
    worker = make(_options(redis_client))
    with caplog.at_level(logging.INFO, logger="workers.task"):
        assert worker.listen(max_events=3, idle_timeout=2.0) == 3
    assert _answered(redis_client) == ["wf-live"]
    assert worker.stats.ignored == 2
    assert redis_client.xpending(KEYS.tasks("default"), "workers")["pending"] == 0
    assert "task wf-ended/1/2 not started: workflow wf-ended stopped it" in caplog.text
    assert "task wf-ended/2/2 not started: workflow wf-ended stopped it" in caplog.text
    if isinstance(worker, Recording):
        assert worker.ran == ["wf-live"]


def test_one_hmget_per_batch_checks_every_workflow_of_it(redis_client: redis.Redis) -> None:
    redis_client.hset(KEYS.stopped, "wf-3", "{}")
    for n in range(6):
        redis_client.xadd(KEYS.tasks("default"), _start_task(f"wf-{n % 4}", str(n)))  # type: ignore[arg-type]
    worker = NoopWorker(["default"], batch_size=10, **_options(redis_client))
    before = _calls(redis_client, "hmget")
    assert worker.listen(max_events=6, idle_timeout=2.0) == 6
    assert _calls(redis_client, "hmget") - before == 1
    assert sorted(_answered(redis_client)) == ["wf-0", "wf-0", "wf-1", "wf-1", "wf-2"]


def test_without_ended_workflows_every_task_runs(redis_client: redis.Redis) -> None:
    redis_client.xadd(KEYS.tasks("default"), _start_task("wf-a"))  # type: ignore[arg-type]
    worker = Recording(**_options(redis_client))
    assert worker.listen(max_events=1, idle_timeout=2.0) == 1
    assert worker.ran == ["wf-a"] and worker.stats.ignored == 0


def _calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def test_a_terminated_workflows_queued_tasks_are_not_run_once_a_worker_comes(
    redis_client: redis.Redis,
) -> None:
    lifecycle = LifecycleWorker(**_options(redis_client))
    thread = threading.Thread(target=lifecycle.listen, daemon=True)
    thread.start()
    try:
        # No worker of kind default yet: the fan-out's start-tasks wait in the stream.
        workflow = start_workflow(redis_client, compile_text("{ A  B }"), {"n": 1})
        wait_until(lambda: redis_client.xlen(KEYS.tasks("default")) == 2, what="two start-tasks")
        Client(redis_client).terminate(workflow, "enough", wait=5)
        wait_until(lambda: redis_client.hexists(KEYS.stopped, workflow), what="stopped")
        worker = Recording(batch_size=10, **_options(redis_client))
        assert worker.listen(max_events=2, idle_timeout=2.0) == 2
        assert worker.ran == [] and worker.stats.ignored == 2
    finally:
        lifecycle.stop()
        thread.join(timeout=10)


def test_a_restarts_next_attempt_runs_while_the_attempt_it_replaced_is_skipped(
    redis_client: redis.Redis,
) -> None:
    redis_client.hset(KEYS.stopped, "wf-again", '{"1": 2}')  # attempt 2 of step 1 stopped
    old, new = _start_task("wf-again"), _start_task("wf-again")
    new[b"attempt"], new[b"id"] = b"3", b'"wf-again/1/3"'
    other = _start_task("wf-again", "4")  # a step the stop did not name: runs
    for fields in (old, new, other):
        redis_client.xadd(KEYS.tasks("default"), fields)  # type: ignore[arg-type]
    worker = NoopWorker(["default"], batch_size=10, **_options(redis_client))
    assert worker.listen(max_events=3, idle_timeout=2.0) == 3
    assert worker.stats.ignored == 1
    assert _answered(redis_client) == ["wf-again", "wf-again"]


@pytest.mark.parametrize("batch_size", [1, 10])
def test_without_any_stop_record_no_hmget_is_sent_and_no_round_trip_added(
    batch_size: int, redis_client: redis.Redis
) -> None:
    for n in range(3):
        redis_client.xadd(KEYS.tasks("default"), _start_task(f"wf-{n}"))  # type: ignore[arg-type]
    worker = Recording(batch_size=batch_size, **_options(redis_client))
    before = _calls(redis_client, "hmget"), _calls(redis_client, "exists")
    assert worker.listen(max_events=3, idle_timeout=2.0) == 3
    assert worker.ran == ["wf-0", "wf-1", "wf-2"]
    assert _calls(redis_client, "hmget") == before[0]
    # The EXISTS went with the reads (XREADGROUP ... then EXISTS, one round trip each).
    reads = 3 // batch_size + (3 % batch_size > 0)
    assert _calls(redis_client, "exists") - before[1] >= reads


def test_a_stop_record_written_while_the_worker_reads_is_seen_at_its_next_read(
    redis_client: redis.Redis,
) -> None:
    redis_client.xadd(KEYS.tasks("default"), _start_task("wf-live"))  # type: ignore[arg-type]
    worker = Recording(batch_size=10, **_options(redis_client))
    assert worker.listen(max_events=1, idle_timeout=2.0) == 1
    redis_client.hset(KEYS.stopped, "wf-gone", "{}")
    redis_client.xadd(KEYS.tasks("default"), _start_task("wf-gone"))  # type: ignore[arg-type]
    assert worker.listen(max_events=1, idle_timeout=2.0) == 1
    assert worker.ran == ["wf-live"] and worker.stats.ignored == 1


def test_garbage_naming_a_stopped_workflow_is_dead_lettered_not_set_aside(
    redis_client: redis.Redis,
) -> None:
    redis_client.hset(KEYS.stopped, "wf\x01", "{}")
    garbage = {**_start_task("wf"), b"workflow": b'"wf\x01"'}  # a raw control character
    redis_client.xadd(KEYS.tasks("default"), garbage)  # type: ignore[arg-type]
    worker = NoopWorker(["default"], batch_size=10, **_options(redis_client))
    assert worker.listen(max_events=1, idle_timeout=2.0) == 1
    assert worker.stats.ignored == 0 and worker.stats.dead_lettered == 1
    assert _answered(redis_client) == []


def test_a_user_refused_exists_still_has_stopped_tasks_set_aside(
    redis_client: redis.Redis, redis_url: str
) -> None:
    # A task-worker ACL written before the EXISTS went along with each read.
    redis_client.execute_command(
        "ACL", "SETUSER", "no-exists", "on", ">pw", "~*", "&*", "+@all", "-exists"
    )
    try:
        redis_client.hset(KEYS.stopped, "wf-ended", "{}")
        for workflow in ("wf-ended", "wf-live"):
            redis_client.xadd(KEYS.tasks("default"), _start_task(workflow))  # type: ignore[arg-type]
        restricted = redis.Redis.from_url(redis_url, username="no-exists", password="pw")
        worker = NoopWorker(["default"], batch_size=10, **_options(restricted))
        assert worker.listen(max_events=2, idle_timeout=2.0) == 2
        assert worker.stats.ignored == 1
        assert _answered(redis_client) == ["wf-live"]
        restricted.close()
    finally:
        redis_client.execute_command("ACL", "DELUSER", "no-exists")
