"""Priorities: a workflow's tasks go to its kinds' stream of its priority, and a kind's
workers run the higher priorities first without starving the lower ones."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle import records as rec
from lifecycle.audit.receipts import ReceiptsWorker
from lifecycle.audit.recover import recover
from lifecycle.audit.report import audit_archive
from lifecycle.audit.segments import SegmentSink
from lifecycle.cli import main as cli_main
from lifecycle.client import Client
from lifecycle.dead_letters import sources
from lifecycle.engine.advance import Advancer
from lifecycle.errors import BadEvent
from lifecycle.events import (
    PAUSE_WORKFLOW,
    RESUME_WORKFLOW,
    control,
    end_task,
    parse_start_workflow,
)
from lifecycle.history import engine_streams
from lifecycle.keys import TASK_GROUP, Keys
from lifecycle.priorities import BadPriority, stream_priority, task_streams
from lifecycle.status import read_status
from lifecycle.submit import start_workflow, start_workflows
from tests.conftest import wait_until
from tests.lifecycle.audit_helpers import archive_all, archived_ids
from workers.task import Task, TaskListener

KEYS = Keys()
ROOT = Path(__file__).parent.parent.parent
CHAIN = compile_text("@flow chain\nA → B")
ONE = compile_text("@flow one\nA")


def _advance(client: redis.Redis) -> None:
    """Apply every lifecycle event waiting (the engine's part, without its loop)."""
    try:
        client.xgroup_create(KEYS.lifecycle, KEYS.lifecycle_group, id="0", mkstream=True)
    except redis.ResponseError as error:
        assert "BUSYGROUP" in str(error)
    advancer = Advancer(client, KEYS)
    while True:
        reply: Any = client.xreadgroup(
            KEYS.lifecycle_group, "test", {KEYS.lifecycle: ">"}, count=1000
        )
        entries = [
            (i.decode(), {k.decode(): orjson.loads(v) for k, v in f.items()})
            for _, items in reply or []
            for i, f in items
        ]
        if not entries:
            return
        advancer.apply(entries)


class Recorder(TaskListener):
    """Runs nothing: notes the priority of each task it is handed, in order."""

    kind = "default"

    def __init__(self, **options: Any) -> None:
        super().__init__(handle_signals=False, block_ms=50, **options)
        self.seen: list[int] = []

    def run(self, task: Task) -> Any:
        priority = stream_priority(KEYS, str(self.current_stream))
        assert task.input == {"priority": priority}  # the workflow's, routed to its stream
        self.seen.append(priority)
        return {}


def _backlog(client: redis.Redis, low: int, high: int, priority: int = 5) -> None:
    """``low`` priority-0 workflows' start-tasks waiting, then ``high`` of ``priority``."""
    start_workflows(client, ONE, [{"priority": 0}] * low, keys=KEYS)
    _advance(client)
    start_workflows(client, ONE, [{"priority": priority}] * high, keys=KEYS, priority=priority)
    _advance(client)


def test_a_workflows_priority_is_stored_and_each_of_its_start_tasks_carries_it(
    redis_client: redis.Redis,
) -> None:
    workflow = Client(redis_client, KEYS).submit(CHAIN, {"x": 1}, priority=3)
    _advance(redis_client)
    assert redis_client.hget(KEYS.workflow(workflow), rec.PRIORITY) == b"3"
    assert redis_client.smembers(KEYS.priorities) == {b"default:3"}
    assert redis_client.xlen(KEYS.tasks("default")) == 0
    ((_, fields),) = redis_client.xrange(KEYS.tasks("default", 3))
    assert orjson.loads(fields[b"priority"]) == 3
    # the next task of the chain goes to the same stream
    start = {k.decode(): orjson.loads(v) for k, v in fields.items()}
    answer = end_task(start, {"y": 1})
    redis_client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in answer.items()})
    _advance(redis_client)
    assert redis_client.xlen(KEYS.tasks("default", 3)) == 2


def test_a_workflow_of_priority_0_uses_the_kinds_stream_and_writes_no_priority_field(
    redis_client: redis.Redis,
) -> None:
    workflow = start_workflow(redis_client, ONE, {}, keys=KEYS)
    _advance(redis_client)
    assert redis_client.hget(KEYS.workflow(workflow), rec.PRIORITY) is None
    ((_, fields),) = redis_client.xrange(KEYS.tasks("default"))
    assert b"priority" not in fields
    assert not redis_client.exists(KEYS.priorities)


def test_a_priority_out_of_range_is_refused_before_anything_is_stored(
    redis_client: redis.Redis,
) -> None:
    with pytest.raises(BadPriority, match=r"priority: 10 is out of range \(expected -9..9\)"):
        start_workflow(redis_client, ONE, {}, keys=KEYS, priority=10)
    with pytest.raises(BadPriority, match="not an integer"):
        Client(redis_client, KEYS).submit(ONE, {}, priority=True)
    assert redis_client.dbsize() == 0
    with pytest.raises(BadEvent, match="field 'priority' is 12, expected -9..9"):
        parse_start_workflow("1-0", {"workflow": "w", "graph": "g", "priority": 12})


@pytest.mark.parametrize(("value", "says"), [("10", "out of range"), ("high", "not an integer")])
def test_run_with_a_bad_priority_is_one_line_and_exit_2(value: str, says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lifecycle", "run", "examples/orders.flow", "--priority", value],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and says in done.stderr and "--priority" in done.stderr


def test_higher_priority_tasks_start_before_lower_ones_already_waiting(
    redis_client: redis.Redis, pool: redis.ConnectionPool
) -> None:
    _backlog(redis_client, low=20, high=3)
    worker = Recorder(pool=pool)
    worker.listen(max_events=6)
    # one read takes one entry of each stream and runs the higher first: the three
    # high-priority tasks start in the first three batches, ahead of the 20 waiting
    assert worker.seen == [5, 0, 5, 0, 5, 0]


def test_lower_priorities_keep_progressing_under_a_steady_higher_load(
    redis_client: redis.Redis, pool: redis.ConnectionPool
) -> None:
    _backlog(redis_client, low=10, high=40)
    start_workflows(redis_client, ONE, [{"priority": -2}] * 10, keys=KEYS, priority=-2)
    _advance(redis_client)
    worker = Recorder(pool=pool)
    worker.listen(max_events=30)
    # high-priority tasks waited all along, yet every batch also ran one of each other
    # priority: ten batches, in priority order within each
    assert worker.seen == [5, 0, -2] * 10


def test_a_dead_workers_pending_entries_on_every_priority_stream_are_claimed(
    redis_client: redis.Redis, pool: redis.ConnectionPool
) -> None:
    _backlog(redis_client, low=2, high=2)
    streams = [KEYS.tasks("default", 5), KEYS.tasks("default")]
    for stream in streams:
        redis_client.xgroup_create(stream, TASK_GROUP, id="0")
    # a worker that read a batch from both streams, then was killed before acknowledging
    taken: Any = redis_client.xreadgroup(TASK_GROUP, "killed", dict.fromkeys(streams, ">"), 1)
    assert sum(len(items) for _, items in taken) == 2
    worker = Recorder(pool=pool, claim_idle=0.2, batch_size=10)
    worker.listen(max_events=4, idle_timeout=5)
    assert sorted(worker.seen) == [0, 0, 5, 5]
    for stream in streams:
        assert redis_client.xpending(stream, TASK_GROUP)["pending"] == 0


def test_receipts_archive_the_priority_streams_and_trim_what_workers_took(
    redis_client: redis.Redis, pool: redis.ConnectionPool, tmp_path: Path
) -> None:
    _backlog(redis_client, low=1, high=2, priority=7)
    Recorder(pool=pool).listen(max_events=3)  # every start-task taken and acknowledged
    high = KEYS.tasks("default", 7)
    sink = SegmentSink(tmp_path)
    worker = ReceiptsWorker(
        redis_client, sink, KEYS, block_ms=50, rescan_every=0.05, trim_every=0.05
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        # (trimming keeps the last entry every group is past: MINID is its id)
        wait_until(lambda: redis_client.xlen(high) == 1, what="the priority stream trimmed")
    finally:
        worker.stop()
        thread.join(timeout=10)
        sink.close()
    archived = archived_ids(tmp_path)
    assert len(archived[high]) == 2
    assert len(archived[KEYS.tasks("default")]) == 1


def test_status_history_and_dead_letters_see_each_priority_stream(
    redis_client: redis.Redis,
) -> None:
    _backlog(redis_client, low=1, high=2, priority=-4)
    found = read_status(redis_client, KEYS)
    lengths = {info.source: (info.stream, info.length) for info in found.kinds}
    assert lengths == {
        "default": (KEYS.tasks("default"), 1),
        "default:p-4": (KEYS.tasks("default", -4), 2),
    }
    assert KEYS.tasks("default", -4) in engine_streams(redis_client, KEYS)
    assert sources(redis_client, KEYS, "default:p-4") == [
        ("default:p-4", KEYS.tasks("default", -4))
    ]


def test_task_streams_list_each_kinds_streams_highest_priority_first(
    redis_client: redis.Redis,
) -> None:
    redis_client.sadd(KEYS.kinds, "b", "a")
    redis_client.sadd(KEYS.priorities, "a:-1", "a:2", "b:9", "junk", "a:x")
    names = [t.source for t in task_streams(redis_client, KEYS)]
    assert names == ["a:p2", "a", "a:p-1", "b:p9", "b"]
    assert [t.source for t in task_streams(redis_client, KEYS, ["b"])] == ["b:p9", "b"]


def test_a_resume_sends_the_held_start_tasks_to_the_workflows_priority_stream(
    redis_client: redis.Redis,
) -> None:
    workflow = Client(redis_client, KEYS).submit(CHAIN, {}, priority=2)
    _advance(redis_client)
    stream = KEYS.tasks("default", 2)
    _send(redis_client, control(PAUSE_WORKFLOW, workflow))
    ((_, fields),) = redis_client.xrange(stream)
    _send(redis_client, end_task({k.decode(): orjson.loads(v) for k, v in fields.items()}, {}))
    assert redis_client.xlen(stream) == 1  # B is held while paused
    _send(redis_client, control(RESUME_WORKFLOW, workflow))
    assert redis_client.xlen(stream) == 2
    _, fields = redis_client.xrange(stream)[1]
    assert orjson.loads(fields[b"name"]) == "B" and orjson.loads(fields[b"priority"]) == 2


def _send(client: redis.Redis, event: dict[str, Any]) -> None:
    client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in event.items()})
    _advance(client)


def test_replay_matches_and_recover_resends_to_the_priority_stream_and_registers_it(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    waiting = compile_text("@flow waits\nslow:A")  # a kind nobody serves: its task stays
    done = start_workflow(redis_client, CHAIN, {}, keys=KEYS, priority=-3)
    _advance(redis_client)
    for n in range(2):  # answer A, then B, of the chain
        _, fields = redis_client.xrange(KEYS.tasks("default", -3))[n]
        answer = end_task({k.decode(): orjson.loads(v) for k, v in fields.items()}, {})
        redis_client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in answer.items()})
        _advance(redis_client)
    running = start_workflow(redis_client, waiting, {}, keys=KEYS, priority=4)
    _advance(redis_client)
    archive_all(redis_client, tmp_path / "archive")
    report = audit_archive(tmp_path / "archive", KEYS, client=redis_client)
    assert report.ok, report.first_problem
    assert {w.workflow: w.live for w in report.workflows} == {done: "equal", running: "equal"}

    redis_client.flushdb()  # Redis lost: recover restores both, resends the waiting task
    restored = recover(redis_client, tmp_path / "archive", KEYS)
    assert sorted(restored.restored) == sorted([done, running]) and restored.resent == 1
    ((_, fields),) = redis_client.xrange(KEYS.tasks("slow", 4))
    assert orjson.loads(fields[b"workflow"]) == running
    assert b"slow:4" in redis_client.smembers(KEYS.priorities)
    assert redis_client.hget(KEYS.workflow(running), rec.PRIORITY) == b"4"


def test_inspect_shows_a_workflows_priority(
    redis_client: redis.Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    workflow = start_workflow(redis_client, ONE, {}, keys=KEYS, priority=6)
    _advance(redis_client)
    assert cli_main(["inspect", workflow, "--json", "--redis-url", redis_url]) == 0
    assert orjson.loads(capsys.readouterr().out)["priority"] == 6
    assert cli_main(["inspect", workflow, "--redis-url", redis_url]) == 0
    assert "priority 6" in capsys.readouterr().out


class Failing(TaskListener):
    """Kind ``bad``: every task raises in the listener (not in run), so it is dead-lettered."""

    kind = "bad"

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        raise RuntimeError("boom")


def test_a_task_dead_lettered_on_a_priority_stream_fails_its_workflow(
    redis_client: redis.Redis, pool: redis.ConnectionPool, in_threads: Any
) -> None:
    from lifecycle.worker import LifecycleWorker

    workflow = start_workflow(redis_client, compile_text("bad:x"), {}, keys=KEYS, priority=2)
    options = {"pool": pool, "handle_signals": False, "block_ms": 50}
    in_threads(
        LifecycleWorker(**options),
        Failing(max_deliveries=1, claim_idle=0.1, **options),
    )

    def failed() -> bool:
        return b'"failed"' in (redis_client.hget(KEYS.workflow(workflow), rec.STATE) or b"")

    wait_until(failed, 15, "the workflow to fail")
    assert redis_client.xlen(KEYS.tasks("bad", 2) + ":dead") == 1
