"""Task workers run each task of a ``start-tasks`` pack as a lone start-task would run,
and put back, one start-task each, the tasks they do not run."""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle import events as ev
from lifecycle.client import Client
from lifecycle.engine.advance import Advancer
from lifecycle.keys import TASK_GROUP, Keys
from lifecycle.kind_limits import set_kind_limit
from rqse.keys import dead_letter_key
from tests.lifecycle.harness import Harness, decode
from workers.noop import NoopWorker, SimulatedWorker
from workers.task import RECHECK_EVERY, HandBack, Task, TaskListener

KEYS = Keys()
STREAM = KEYS.tasks("default")


def _options(client: redis.Redis, **more: Any) -> dict[str, Any]:
    return {"pool": client.connection_pool, "handle_signals": False, "block_ms": 20, **more}


def _packing(client: redis.Redis) -> Harness:
    harness = Harness(client)
    harness.advancer = Advancer(client, KEYS, pack_starts=True)
    return harness


def _entries(client: redis.Redis, stream: str = STREAM) -> list[dict[str, Any]]:
    return [decode(fields) for _, fields in client.xrange(stream)]


def _answers(client: redis.Redis) -> list[dict[str, Any]]:
    """Every answer on the lifecycle stream, packed ones unpacked."""
    found = []
    for entry_id, fields in client.xrange(KEYS.lifecycle):
        event = decode(fields)
        if event["kind"] == ev.END_TASK:
            found.append(event)
        elif event["kind"] == ev.END_TASKS:
            found += ev.unpacked_answers(entry_id.decode(), event)
    return found


def _pending(client: redis.Redis, stream: str = STREAM) -> int:
    return int(client.xpending(stream, TASK_GROUP)["pending"])


def _drive(harness: Harness, worker: Any, rounds: int = 60) -> None:
    for _ in range(rounds):
        advanced = harness.advance()
        answered = worker.listen(idle_timeout=0.05)
        if not advanced and not answered:
            return
    raise AssertionError(f"still busy after {rounds} rounds")


def _states(client: redis.Redis, ids: list[str]) -> list[str]:
    return [Client(client, KEYS).status(i).state for i in ids]


class Recording(TaskListener):
    kind = "default"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.ran: list[str] = []

    def run(self, task: Task) -> Any:
        self.ran.append(task.id)
        return {"n": task.input["n"], "ran": True}


def test_a_task_listener_runs_and_answers_each_task_of_a_pack(redis_client: redis.Redis) -> None:
    harness = _packing(redis_client)
    ids = [harness.submit(compile_text("A"), {"n": n}, f"wf{n}") for n in range(5)]
    harness.advance()
    assert [e["kind"] for e in _entries(redis_client)] == [ev.START_TASKS]
    worker = Recording(**_options(redis_client))
    assert worker.listen(idle_timeout=0.05) == 1  # one entry
    assert sorted(worker.ran) == sorted(f"{i}/1/1" for i in ids)
    answers = _answers(redis_client)
    assert sorted((a["workflow"], a["output"]["n"]) for a in answers) == [
        (i, n) for n, i in enumerate(ids)
    ]
    assert _pending(redis_client) == 0
    harness.advance()
    assert _states(redis_client, ids) == ["finished"] * 5


@pytest.mark.parametrize("pack_answers", [False, True], ids=["end-task", "end-tasks"])
def test_chains_and_fan_outs_finish_on_packed_starts_through_the_noop_worker(
    redis_client: redis.Redis, pack_answers: bool
) -> None:
    harness = _packing(redis_client)
    worker = NoopWorker(["default"], pack_answers=pack_answers, **_options(redis_client))
    ids = [harness.submit(compile_text("A → B → C"), {"n": n}, f"c{n}") for n in range(10)]
    ids += [harness.submit(compile_text("A → B|C|D → E"), {"n": n}, f"f{n}") for n in range(5)]
    _drive(harness, worker)
    assert _states(redis_client, ids) == ["finished"] * len(ids)
    assert _pending(redis_client) == 0
    # Every task's answer carries the input it was given: output = input.
    outputs = {(a["workflow"], a["key"]): a["output"] for a in _answers(redis_client)}
    assert outputs[("c3", "2")] == {"n": 3}
    kinds = {e["kind"] for e in _entries(redis_client)}
    assert kinds == {ev.START_TASKS}


def test_a_simulated_worker_runs_packed_tasks_to_the_end_of_their_flows(
    redis_client: redis.Redis,
) -> None:
    harness = _packing(redis_client)
    worker = SimulatedWorker(["default"], delay_max=0, **_options(redis_client))
    ids = [
        harness.submit(compile_text("A → * B → C"), {"items": [1, 2, 3]}, f"i{n}") for n in range(4)
    ]
    _drive(harness, worker)
    assert _states(redis_client, ids) == ["finished"] * 4


def test_a_stopped_workflows_tasks_in_a_pack_are_not_run_and_the_others_are(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    harness = _packing(redis_client)
    ids = [harness.submit(compile_text("A"), {"n": n}, f"wf{n}") for n in range(3)]
    harness.advance()
    redis_client.hset(KEYS.stopped, "wf1", b"{}")  # wf1 ended: its attempts are stopped
    worker = Recording(**_options(redis_client))
    with caplog.at_level(logging.INFO, logger="workers.task"):
        worker.listen(idle_timeout=0.05)
    assert sorted(worker.ran) == ["wf0/1/1", "wf2/1/1"]
    assert "task wf1/1/1 not started: workflow wf1 stopped it" in caplog.text
    assert sorted(a["workflow"] for a in _answers(redis_client)) == [ids[0], ids[2]]
    assert _pending(redis_client) == 0


class StopsAfterOne(Recording):
    """Asks its listener to stop while running its first task."""

    def run(self, task: Task) -> Any:
        if not self.ran:
            self.stop()
        return super().run(task)


def test_a_stop_mid_pack_puts_the_tasks_not_run_back_one_start_task_each(
    redis_client: redis.Redis,
) -> None:
    harness = _packing(redis_client)
    ids = [harness.submit(compile_text("A"), {"n": n}, f"wf{n}") for n in range(4)]
    harness.advance()
    stopping = StopsAfterOne(**_options(redis_client))
    stopping.listen()
    assert len(stopping.ran) == 1
    back = _entries(redis_client)[1:]
    assert [e["kind"] for e in back] == [ev.START_TASK] * 3
    assert all(e[ev.RECOVERED] is True for e in back)
    assert _pending(redis_client) == 0  # the pack is acknowledged with what went back
    worker = Recording(**_options(redis_client))
    worker.listen(idle_timeout=0.05)
    assert sorted(stopping.ran + worker.ran) == sorted(f"{i}/1/1" for i in ids)
    harness.advance()
    assert _states(redis_client, ids) == ["finished"] * 4


class HandsBackTheSecond(Recording):
    def run(self, task: Task) -> Any:
        if task.input["n"] == 1 and task.id not in self.ran:
            self.ran.append(task.id)
            raise HandBack()
        return super().run(task)


def test_a_task_of_a_pack_handed_back_goes_back_alone_and_the_rest_are_answered(
    redis_client: redis.Redis,
) -> None:
    harness = _packing(redis_client)
    ids = [harness.submit(compile_text("A"), {"n": n}, f"wf{n}") for n in range(3)]
    harness.advance()
    worker = HandsBackTheSecond(**_options(redis_client))
    worker.listen(idle_timeout=0.05)  # the pack, then the handed-back task alone
    entries = _entries(redis_client)
    assert [e["kind"] for e in entries] == [ev.START_TASKS, ev.START_TASK]
    assert entries[1]["workflow"] == "wf1"
    harness.advance()
    assert _states(redis_client, ids) == ["finished"] * 3
    assert _pending(redis_client) == 0


@pytest.mark.parametrize(
    "make",
    [
        lambda options: NoopWorker(["default"], **options),
        lambda options: Recording(batch_size=10, **options),
    ],
    ids=["noop", "task-listener"],
)
def test_a_pack_of_a_limited_kind_goes_back_one_start_task_each_to_take_its_slot(
    redis_client: redis.Redis, make: Any
) -> None:
    set_kind_limit(redis_client, KEYS, "default", 1)
    harness = _packing(redis_client)
    ids = [harness.submit(compile_text("A"), {"n": n}, f"wf{n}") for n in range(3)]
    harness.advance()
    worker = make(_options(redis_client))
    worker.listen(idle_timeout=0.1)
    entries = _entries(redis_client)
    assert [e["kind"] for e in entries] == [ev.START_TASKS] + [ev.START_TASK] * 3
    harness.advance()
    assert _states(redis_client, ids) == ["finished"] * 3
    assert _pending(redis_client) == 0


@pytest.mark.parametrize(
    "make",
    [
        lambda options: NoopWorker(["default"], **options),
        lambda options: Recording(**options),
    ],
    ids=["noop", "task-listener"],
)
def test_a_pack_whose_tasks_are_not_a_list_is_dead_lettered_at_once_naming_the_field(
    redis_client: redis.Redis, make: Any
) -> None:
    redis_client.xgroup_create(STREAM, TASK_GROUP, id="0", mkstream=True)
    entry_id = redis_client.xadd(STREAM, {"kind": b'"start-tasks"', "tasks": b'{"no": 1}'})
    make(_options(redis_client)).listen(idle_timeout=0.05)
    (dead,) = _entries(redis_client, dead_letter_key(STREAM))
    assert dead["id"] == entry_id.decode()
    error = dead["error"]
    assert "field 'tasks'" in error and "expected list" in error
    assert _pending(redis_client) == 0


def test_a_malformed_task_in_a_pack_is_one_warning_and_the_others_run(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    harness = _packing(redis_client)
    harness.submit(compile_text("A"), {"n": 0}, "wf0")
    harness.advance()
    ((entry_id, fields),) = redis_client.xrange(STREAM)
    tasks = orjson.loads(fields[b"tasks"])
    redis_client.xadd(STREAM, {"kind": b'"start-tasks"', "tasks": orjson.dumps([7, *tasks])})
    redis_client.xack(STREAM, TASK_GROUP, entry_id)
    redis_client.xdel(STREAM, entry_id)
    worker = Recording(**_options(redis_client))
    with caplog.at_level(logging.WARNING, logger="workers.task"):
        worker.listen(idle_timeout=0.05)
    assert worker.ran == ["wf0/1/1"]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "workers.task"]
    assert "task 0 is 7" in line and "left out" in line


class RedisGoneOnTheSecond(Recording):
    """Its second task meets a lost connection once (Redis gone from under it)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.failed = False

    def run(self, task: Task) -> Any:
        if task.input["n"] == 1 and not self.failed:
            self.failed = True
            raise redis.ConnectionError("connection lost")
        return super().run(task)


def test_a_task_whose_worker_fails_under_it_sends_it_and_the_rest_back_alone(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    harness = _packing(redis_client)
    ids = [harness.submit(compile_text("A"), {"n": n}, f"wf{n}") for n in range(4)]
    harness.advance()
    worker = RedisGoneOnTheSecond(**_options(redis_client))
    with caplog.at_level(logging.WARNING, logger="workers.task"):
        worker.listen(idle_timeout=0.1)
    # The first ran once; the others went back one start-task each and ran once too.
    assert sorted(worker.ran) == sorted(f"{i}/1/1" for i in ids)
    entries = _entries(redis_client)
    assert [e["kind"] for e in entries] == [ev.START_TASKS] + [ev.START_TASK] * 3
    assert "task wf1/1/1 of a pack: ConnectionError: connection lost" in caplog.text
    harness.advance()
    assert _states(redis_client, ids) == ["finished"] * 4
    assert _pending(redis_client) == 0


def test_a_limit_on_another_kind_leaves_the_noop_workers_packs_whole(
    redis_client: redis.Redis,
) -> None:
    set_kind_limit(redis_client, KEYS, "other", 1)
    harness = _packing(redis_client)
    ids = [harness.submit(compile_text("A"), {"n": n}, f"wf{n}") for n in range(3)]
    harness.advance()
    NoopWorker(["default"], **_options(redis_client)).listen(idle_timeout=0.1)
    assert [e["kind"] for e in _entries(redis_client)] == [ev.START_TASKS]
    harness.advance()
    assert _states(redis_client, ids) == ["finished"] * 3


class ChangesTheWorldOnItsFirstTask(Recording):
    """Runs ``change`` while its first task runs, and takes longer than RECHECK_EVERY."""

    change: Any = None

    def run(self, task: Task) -> Any:
        if not self.ran:
            self.change()
            time.sleep(RECHECK_EVERY + 0.05)
        return super().run(task)


def test_a_workflow_stopped_while_a_pack_runs_has_its_tasks_not_yet_run_skipped(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    harness = _packing(redis_client)
    ids = [harness.submit(compile_text("A"), {"n": n}, f"wf{n}") for n in range(4)]
    harness.advance()
    worker = ChangesTheWorldOnItsFirstTask(**_options(redis_client))
    worker.change = lambda: redis_client.hset(KEYS.stopped, "wf2", b"{}")
    with caplog.at_level(logging.INFO, logger="workers.task"):
        worker.listen(idle_timeout=0.05)
    assert sorted(worker.ran) == ["wf0/1/1", "wf1/1/1", "wf3/1/1"]
    assert "task wf2/1/1 not started: workflow wf2 stopped it" in caplog.text
    assert _pending(redis_client) == 0
    assert sorted(a["workflow"] for a in _answers(redis_client)) == [ids[0], ids[1], ids[3]]


def test_a_limit_set_while_a_pack_runs_sends_its_tasks_not_yet_run_back_alone(
    redis_client: redis.Redis,
) -> None:
    harness = _packing(redis_client)
    ids = [harness.submit(compile_text("A"), {"n": n}, f"wf{n}") for n in range(4)]
    harness.advance()
    worker = ChangesTheWorldOnItsFirstTask(**_options(redis_client))
    worker.change = lambda: set_kind_limit(redis_client, KEYS, "default", 1)
    worker.listen(idle_timeout=0.2)  # the pack, then the three back alone, under the limit
    entries = _entries(redis_client)
    assert [e["kind"] for e in entries] == [ev.START_TASKS] + [ev.START_TASK] * 3
    assert all(e[ev.RECOVERED] is True for e in entries[1:])
    assert sorted(worker.ran) == sorted(f"{i}/1/1" for i in ids)
    harness.advance()
    assert _states(redis_client, ids) == ["finished"] * 4
    assert _pending(redis_client) == 0
