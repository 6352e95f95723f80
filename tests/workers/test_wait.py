"""The built-in wait: kind against a real Redis: delays, event waits, countdown latches."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from lifecycle.keys import TASK_GROUP
from rqse.events import encode_event
from rqse.server import RedisServer, free_port
from rqse.weather import READONLY, classify
from tests.conftest import wait_until
from tests.workers.helpers import (
    KEYS,
    Threads,
    entry_ms,
    events,
    state,
    submit,
    wait_for_end,
)
from workers import Task, TaskListener
from workers.wait import WaitTaskListener, WaitWorker


def wait_worker(threads: Threads, **options: Any) -> WaitWorker:
    worker = WaitWorker(
        pool=threads.pool, handle_signals=False, block_ms=100, poll_interval=0.02, **options
    )
    return threads.start(worker)


def started_and_ended(client: redis.Redis, workflow: str) -> tuple[int, int]:
    """Redis ms of the workflow's one wait start-task and of its end-task."""
    (start_id, _), *_ = [
        (i, e) for i, e in events(client, KEYS.tasks("wait")) if e["workflow"] == workflow
    ]
    (end_id, _), *_ = [
        (i, e) for i, e in events(client, KEYS.lifecycle, "end-task") if e["workflow"] == workflow
    ]
    return entry_ms(start_id), entry_ms(end_id)


@pytest.mark.parametrize("duration", [0.4, "400ms", "0.4s"])
def test_a_delay_ends_after_its_duration_with_its_input_as_output(
    redis_client: redis.Redis, threads: Threads, duration: Any
) -> None:
    threads.lifecycle()
    wait_worker(threads)
    workflow = submit(redis_client, f"wait:delay (- duration: {duration!r} -)", {"n": 1})
    assert wait_for_end(redis_client, workflow) == {"status": "finished", "output": {"n": 1}}
    started, ended = started_and_ended(redis_client, workflow)
    assert 400 <= ended - started < 700
    assert redis_client.zcard(KEYS.wait_delays) == 0 and not redis_client.exists(KEYS.waits)


def test_a_wait_event_ends_only_on_a_later_event_whose_fields_match_the_input(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    worker = wait_worker(threads)
    early = {"kind": "approved", "channel": "orders", "order": 7, "output": {"early": 1}}
    early_id = redis_client.xadd(KEYS.lifecycle, encode_event(early))
    flow = "wait:event (- {event: approved, channel: orders, match: input} -)"
    workflow = submit(redis_client, flow, {"order": 7})
    wait_until(lambda: redis_client.hlen(KEYS.wait_events("approved")), what="registration")
    for order in (8, 7):
        event = {
            "kind": "approved",
            "channel": "orders",
            "order": order,
            "output": {"by": f"order {order}"},
        }
        redis_client.xadd(KEYS.lifecycle, encode_event(event))
    final = wait_for_end(redis_client, workflow)
    assert final == {"status": "finished", "output": {"by": "order 7"}}
    receipts = [e for _, e in events(redis_client, KEYS.lifecycle, "receipt")]
    assert len(receipts) == 1 and receipts[0]["for"] != early_id.decode()
    assert receipts[0]["target"].startswith(workflow)
    assert worker.watcher is not None and worker.watcher.ended == 1
    assert not redis_client.exists(KEYS.wait_events("approved"), KEYS.waits)


def test_a_wait_event_with_a_match_mapping_outputs_its_input_without_a_receipt(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    wait_worker(threads)
    flow = "wait:event (- {event: go, match: {batch: '{input[b]}'}, receipt: false} -)"
    workflow = submit(redis_client, flow, {"b": 3, "keep": "me"})
    wait_until(lambda: redis_client.hlen(KEYS.wait_events("go")), what="registration")
    to_it = {"kind": "go", "workflow": workflow}
    redis_client.xadd(KEYS.lifecycle, encode_event({**to_it, "batch": "3"}))  # '3' is not 3
    redis_client.xadd(KEYS.lifecycle, encode_event({**to_it, "batch": 3}))
    assert wait_for_end(redis_client, workflow)["output"] == {"b": 3, "keep": "me"}
    assert events(redis_client, KEYS.lifecycle, "receipt") == []


class Held(TaskListener):
    """Ends each task only when the test hands out a permit."""

    kind = "hold"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.permits = threading.Semaphore(0)

    def run(self, task: Task) -> Any:
        if not self.permits.acquire(timeout=20):
            raise TimeoutError("no permit")
        return task.input


def test_fifty_workflows_hold_one_latch_and_a_countdown_ends_only_when_it_reaches_zero(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    wait_worker(threads)
    held = threads.start(Held(pool=threads.pool, handle_signals=False, block_ms=100))
    holders = [
        submit(
            redis_client,
            "wait:acquire (- name: 'batch-{input[batch]}' -) → hold:work "
            '→ wait:release (- name: "batch-{input[\\"batch\\"]}" -)',
            {"batch": 1, "n": n},
        )
        for n in range(50)
    ]
    latch = KEYS.latch("batch-1")
    wait_until(lambda: redis_client.get(latch) == b"50", what="50 acquisitions")
    counter = submit(redis_client, "wait:countdown (- name: 'batch-{input[b]}' -)", {"b": 1})
    wait_until(lambda: redis_client.scard(KEYS.latch_waiters("batch-1")), what="countdown wait")
    for _ in range(49):
        held.permits.release()
    wait_until(lambda: redis_client.get(latch) == b"1", what="49 releases")
    assert state(redis_client, counter)["status"] == "running"
    held.permits.release()
    assert wait_for_end(redis_client, counter) == {"status": "finished", "output": {"b": 1}}
    assert all(wait_for_end(redis_client, w)["status"] == "finished" for w in holders)
    # end-tasks name their task by workflow and key; the start-tasks say which task that is
    names = {
        (e["workflow"], e["key"]): e["name"]
        for _, e in events(redis_client, KEYS.tasks("wait"), "start-task")
    }
    ends = [
        (i, names.get((e["workflow"], e["key"])))
        for i, e in events(redis_client, KEYS.lifecycle, "end-task")
    ]
    releases = [i for i, name in ends if name == "wait:release"]
    (countdown_end,) = [i for i, name in ends if name == "wait:countdown"]
    assert len(releases) == 50
    assert countdown_end > max(releases, key=lambda i: tuple(map(int, i.split("-"))))
    assert not redis_client.exists(latch, KEYS.latch_waiters("batch-1"), KEYS.waits)


def test_a_countdown_on_a_free_latch_ends_at_once_and_a_release_of_it_fails(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    wait_worker(threads)
    free = submit(redis_client, "wait:countdown (- name: idle -)", {"a": 1})
    assert wait_for_end(redis_client, free) == {"status": "finished", "output": {"a": 1}}
    bad = submit(redis_client, "wait:release (- name: idle -)")
    final = wait_for_end(redis_client, bad)
    assert final["status"] == "failed"
    assert 'latch "idle" is not held' in final["error"]


@pytest.mark.parametrize(
    ("flow", "message"),
    [
        ("wait:acquire (- name: 'x-{input.__class__}' -)", "column 9: attribute access"),
        ("wait:acquire (- name: 'x-{input[id]}' -)", "input has no item 'id'"),
        ("wait:delay (- duration: soon -)", "duration 'soon'"),
        ("wait:nap", "unknown built-in task 'wait:nap'"),
        ("wait:event (- {match: input} -)", "parameter 'event'"),
    ],
)
def test_a_wait_task_with_bad_parameters_fails_with_a_message_naming_the_problem(
    redis_client: redis.Redis, threads: Threads, flow: str, message: str
) -> None:
    threads.lifecycle()
    wait_worker(threads)
    final = wait_for_end(redis_client, submit(redis_client, flow, {"no": "id"}))
    assert final["status"] == "failed"
    assert message in final["error"]


def delivered_acquire(client: redis.Redis) -> tuple[str, dict[str, Any]]:
    """A wait:acquire start-task of latch ``once`` on the wait stream, delivered."""
    stream = KEYS.tasks("wait")
    client.xgroup_create(stream, TASK_GROUP, id="0", mkstream=True)
    start = {
        "kind": "start-task",
        "workflow": "w",
        "name": "wait:acquire",
        "index": 1,
        "key": "1",
        "attempt": 1,
        "id": "w/1/1",
        "input": {},
        "parameters": {"name": "once"},
    }
    entry = client.xadd(stream, encode_event(start)).decode()
    client.xreadgroup(TASK_GROUP, "a", {stream: ">"})
    return entry, start


def test_a_wait_start_task_delivered_twice_takes_effect_once(redis_client: redis.Redis) -> None:
    listener = WaitTaskListener(pool=redis_client.connection_pool, handle_signals=False)
    stream = KEYS.tasks("wait")
    entry, start = delivered_acquire(redis_client)
    for _ in range(2):  # e.g. claimed by a second consumer while the first still had it
        assert listener.process_batch([(entry, start)]) == [entry]
    assert redis_client.get(KEYS.latch("once")) == b"1"
    assert len(events(redis_client, KEYS.lifecycle, "end-task")) == 1
    assert listener.outcomes[0] == 1 and listener.outcomes[1] == 1
    assert redis_client.xpending(stream, TASK_GROUP)["pending"] == 0


def test_a_wait_worker_started_beside_a_lifecycle_worker_stops_and_keeps_its_waits(
    redis_client: redis.Redis, threads: Threads
) -> None:
    """The way `python -m lifecycle worker` runs it: start(), later stop() and join()."""
    threads.lifecycle()
    worker = WaitWorker(pool=threads.pool, handle_signals=False, block_ms=100)
    thread = worker.start()
    workflow = submit(redis_client, "wait:delay (- duration: 60 -)")
    wait_until(lambda: redis_client.zcard(KEYS.wait_delays), what="registration")
    worker.stop()
    worker.stop()  # idempotent
    worker.join(5)
    assert not thread.is_alive()
    assert redis_client.hlen(KEYS.waits) == 1
    assert state(redis_client, workflow)["status"] == "running"


def test_a_wait_start_task_refused_by_a_read_only_redis_is_waited_out_not_rejected() -> None:
    """A replica's refusal is Redis's state, not the task's: it stops the batch (and
    the listener backs off) instead of dead-lettering the task."""
    with RedisServer() as server:
        client = redis.Redis(port=server.port)
        listener = WaitTaskListener(url=server.url, handle_signals=False)
        entry, start = delivered_acquire(client)
        client.replicaof("127.0.0.1", free_port())
        try:
            with pytest.raises(redis.ResponseError) as raised:
                listener.process_batch([(entry, start)])
            assert classify(raised.value) == READONLY
        finally:
            client.replicaof("NO", "ONE")
        assert listener.process_batch([(entry, start)]) == [entry]
        assert client.get(KEYS.latch("once")) == b"1"
        client.close()
