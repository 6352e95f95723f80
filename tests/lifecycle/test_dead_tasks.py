"""A dead-lettered start-task fails its task: the workflow fails with the dead letter's
reason (or retries, by its node's policy) instead of staying running forever."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle.engine.dead_tasks import DeadTasks, DeadTasksThread
from lifecycle.errors import UnknownWorkflow
from lifecycle.events import START_TASK
from lifecycle.inspect import describe_workflow
from lifecycle.keys import Keys
from lifecycle.submit import start_workflow
from lifecycle.worker import LifecycleWorker
from rqse import EventListener
from rqse.keys import dead_letter_key
from rqse.server import RedisServer
from rqse.weather import BUSY, classify
from tests.conftest import wait_until
from tests.rqse.helpers import busy_server
from workers.noop import NoopWorker

KEYS = Keys()


class Broken(EventListener):
    """A plain rqse listener serving kind ``bad`` whose process() always raises."""

    def __init__(self, **options: Any) -> None:
        super().__init__(KEYS.tasks("bad"), "workers", [START_TASK], **options)
        self.tries = 0

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        self.tries += 1
        raise RuntimeError("boom")


class Running:
    def __init__(self, pool: redis.ConnectionPool) -> None:
        self.pool = pool
        self.started: list[tuple[Any, threading.Thread]] = []

    def start(self, listener: Any) -> Any:
        thread = threading.Thread(target=listener.listen, daemon=True)
        thread.start()
        self.started.append((listener, thread))
        return listener

    def options(self) -> dict[str, Any]:
        return {"pool": self.pool, "handle_signals": False, "block_ms": 50}


@pytest.fixture
def running(redis_url: str, redis_client: redis.Redis) -> Iterator[Running]:
    pool = redis.ConnectionPool.from_url(redis_url)
    group = Running(pool)
    try:
        yield group
    finally:
        for listener, _ in group.started:
            listener.stop()
        for _, thread in group.started:
            thread.join(timeout=10)
        pool.disconnect()


def _ended(client: redis.Redis, workflow: str, timeout: float = 15.0) -> dict[str, Any]:
    """What ``inspect`` shows of the workflow once it is no longer running."""

    def ended() -> dict[str, Any] | None:
        try:
            described = describe_workflow(client, KEYS, workflow)
        except UnknownWorkflow:  # not started by the lifecycle yet
            return None
        return described if described["state"] != "running" else None

    return wait_until(ended, timeout, f"workflow {workflow} to end")


def _engine(running: Running) -> None:
    running.start(LifecycleWorker(**running.options()))
    running.start(NoopWorker(["default", "good"], **running.options()))
    running.start(Broken(max_deliveries=2, claim_idle=0.1, **running.options()))


def test_a_dead_lettered_start_task_fails_its_workflow_with_the_reason(
    redis_client: redis.Redis, running: Running
) -> None:
    _engine(running)
    workflow = start_workflow(redis_client, compile_text("A → bad:x → B"), {"n": 1})
    described = _ended(redis_client, workflow)
    assert described["state"] == "failed"
    assert "start-task dead-lettered (process-error): RuntimeError: boom" in described["error"]
    (failed,) = [t for t in described["tasks"] if t["name"] == "bad:x"]
    assert failed["state"] == "failed"
    assert failed["error"] == "start-task dead-lettered (process-error): RuntimeError: boom"


def test_a_kind_served_fine_is_unaffected(redis_client: redis.Redis, running: Running) -> None:
    _engine(running)
    broken = start_workflow(redis_client, compile_text("bad:x"), {})
    fine = start_workflow(redis_client, compile_text("good:y → A"), {"n": 2})
    assert _ended(redis_client, fine)["state"] == "finished"
    assert describe_workflow(redis_client, KEYS, fine)["output"] == {"n": 2}
    assert _ended(redis_client, broken)["state"] == "failed"


def test_the_nodes_retry_policy_retries_a_dead_lettered_task(
    redis_client: redis.Redis, running: Running
) -> None:
    _engine(running)
    workflow = start_workflow(redis_client, compile_text("bad:x (- $retries: 2 -)"), {})
    described = _ended(redis_client, workflow, timeout=30)
    assert described["state"] == "failed"
    (task,) = described["tasks"]
    assert task["attempts"] == 3
    dead = redis_client.xrange(dead_letter_key(KEYS.tasks("bad")))
    assert len(dead) == 3  # one dead letter per attempt, each answered


def test_a_kind_that_appears_later_is_followed(redis_client: redis.Redis, running: Running) -> None:
    running.start(LifecycleWorker(**running.options()))
    listener = running.start(DeadTasks(discover_every=0.05, **running.options()))
    wait_until(lambda: listener.established, what="dead tasks listening")
    running.start(Broken(max_deliveries=1, claim_idle=0.1, **running.options()))
    workflow = start_workflow(redis_client, compile_text("bad:late"), {})
    assert _ended(redis_client, workflow)["state"] == "failed"
    assert dead_letter_key(KEYS.tasks("bad")) in listener.streams


def test_garbage_in_a_dead_letter_is_one_warning_and_acknowledged(
    redis_client: redis.Redis, running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    stream = dead_letter_key(KEYS.tasks("default"))
    for fields in (
        {"kind": "dead-letter", "reason": "process-error", "fields": "not an object"},
        {
            "kind": "dead-letter",
            "reason": "process-error",
            "fields": {"kind": '"start-task"', "workflow": "{oops"},
        },
        {"kind": "dead-letter", "fields": {"kind": '"start-task"', "key": '"1"'}},
        {"kind": "dead-letter", "fields": {"kind": '"end-task"'}},  # not a start-task: quiet
    ):
        redis_client.xadd(stream, {k: orjson.dumps(v) for k, v in fields.items()})
    listener = DeadTasks(**running.options())
    with caplog.at_level(logging.WARNING, logger="lifecycle.engine.dead_tasks"):
        assert listener.listen(max_events=4, idle_timeout=2.0) == 4
    warnings = [r for r in caplog.records if r.name == "lifecycle.engine.dead_tasks"]
    assert len(warnings) == 3
    assert "no original fields" in warnings[0].getMessage()
    assert "not JSON" in warnings[1].getMessage()
    assert "without string workflow and key" in warnings[2].getMessage()
    assert redis_client.xlen(KEYS.lifecycle) == 0
    assert redis_client.xpending(stream, "lifecycle")["pending"] == 0


def test_an_oversize_start_task_is_answered_from_its_stream(
    redis_client: redis.Redis, running: Running
) -> None:
    running.start(LifecycleWorker(**running.options()))
    running.start(Broken(max_entry_bytes=200, **running.options()))
    workflow = start_workflow(redis_client, compile_text("bad:big"), {"blob": "x" * 500})
    described = _ended(redis_client, workflow)
    assert described["state"] == "failed"
    assert "start-task dead-lettered (oversize)" in described["error"]


def test_a_dead_tasks_listener_redis_refuses_ends_in_one_error_line(
    redis_client: redis.Redis, running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    redis_client.set(dead_letter_key(KEYS.tasks("default")), "not a stream")
    thread = DeadTasksThread(DeadTasks(**running.options()))
    with caplog.at_level(logging.ERROR, logger="lifecycle.engine.dead_tasks"):
        thread.start()
        assert thread._thread is not None
        thread._thread.join(timeout=10)
    (record,) = [r for r in caplog.records if r.name == "lifecycle.engine.dead_tasks"]
    assert "dead-lettered start-tasks go unanswered" in record.getMessage()
    assert "WRONGTYPE" in record.getMessage() and record.exc_info is None


def test_a_busy_server_met_reading_an_oversize_task_s_original_is_weather_not_garbage() -> None:
    """BUSY is Redis's state, not the dead letter's: taking it for garbage would
    acknowledge the letter and leave its task unanswered for ever."""
    with RedisServer() as server:
        dead = DeadTasks(url=server.url)
        with busy_server(server), pytest.raises(redis.ResponseError) as raised:
            dead._original({"stream": KEYS.tasks("default"), "id": "1-0"})
        assert classify(raised.value) == BUSY
        assert dead._original({"stream": KEYS.tasks("default"), "id": "1-0"}) is None  # gone
