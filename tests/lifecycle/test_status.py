"""status: streams, workers, workflows by state, warnings in words; exit 1 on a warning."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from flowstream.cli import main
from lifecycle.cli import EXIT_FAILED, EXIT_OK
from lifecycle.keys import TASK_GROUP, Keys
from lifecycle.status import count_workflows
from lifecycle.submit import start_workflow

KEYS = Keys()


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def status(capsys: Any, redis_url: str, *more: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run(capsys, "status", "--json", "--redis-url", redis_url, *more)
    assert err == ""
    return code, orjson.loads(out)


@pytest.fixture
def persistent(redis_client: redis.Redis) -> Iterator[None]:
    """The test server with RDB save points, as a production one has (the fixture's has
    none, which status rightly warns about)."""
    redis_client.config_set("save", "3600 1")
    try:
        yield
    finally:
        redis_client.config_set("save", "")


def test_a_server_without_persistence_is_a_warning(redis_url: str, capsys: Any) -> None:
    code, data = status(capsys, redis_url)
    assert code == EXIT_FAILED
    assert any("persistence off" in w for w in data["warnings"])


def test_an_evicting_server_is_a_warning(
    redis_client: redis.Redis, redis_url: str, capsys: Any, persistent: None
) -> None:
    redis_client.config_set("maxmemory", "1gb")
    redis_client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        code, data = status(capsys, redis_url)
    finally:
        redis_client.config_set("maxmemory-policy", "noeviction")
        redis_client.config_set("maxmemory", "0")
    assert code == EXIT_FAILED
    assert [w for w in data["warnings"] if "maxmemory-policy allkeys-lru" in w]


def test_no_lifecycle_worker_with_events_waiting_is_a_warning(
    redis_client: redis.Redis, redis_url: str, capsys: Any, persistent: None
) -> None:
    start_workflow(redis_client, compile_text("A"), None, "wf-1", KEYS)
    code, out, _ = run(capsys, "status", "--redis-url", redis_url)
    assert code == EXIT_FAILED
    assert (
        "WARNING: no lifecycle worker, 1 event waiting (none has ever read the lifecycle "
        "stream): start one with python -m lifecycle worker"
    ) in out.splitlines()


def test_an_idle_engine_has_its_lifecycle_worker_alive_and_no_warning(
    engine: Any, redis_client: redis.Redis, redis_url: str, capsys: Any, persistent: None
) -> None:
    start_workflow(redis_client, compile_text("A → ml:B"), None, "wf-1", KEYS)
    deadline = time.monotonic() + 10
    while redis_client.hget(KEYS.workflow("wf-1"), "ended") is None:
        assert time.monotonic() < deadline, "the workflow did not finish"
        time.sleep(0.02)
    time.sleep(1.5)  # idle: the workers sit in blocking reads that return nothing
    code, data = status(capsys, redis_url, "--stale", "1")
    assert (code, data["warnings"]) == (EXIT_OK, [])
    assert len(data["lifecycle_workers"]) == 1
    assert data["workflows"]["states"]["finished"] == 1
    assert data["workflows"]["ended_since_start"] == {"finished": 1}
    [ml] = [k for k in data["kinds"] if k["source"] == "ml"]
    assert (ml["length"], ml["group"]["lag"], ml["group"]["pending"], ml["waiting"]) == (
        1,
        0,
        0,
        0,
    )
    assert all(c["idle_ms"] < 1000 for c in ml["group"]["consumers"])
    code, out, _ = run(capsys, "status", "--redis-url", redis_url)
    assert code == EXIT_OK and out.splitlines()[-1] == "no warnings"
    assert "STREAM\tLENGTH\tLAG\tPENDING\tDEAD\tCONSUMERS (idle)" in out


def test_tasks_waiting_that_no_consumer_reads_any_more_are_a_warning(
    redis_client: redis.Redis, redis_url: str, capsys: Any, harness: Any, persistent: None
) -> None:
    harness.submit(compile_text("ml:A"))
    harness.submit(compile_text("ml:B"))
    redis_client.xreadgroup(TASK_GROUP, "gone-worker", {KEYS.tasks("ml"): ">"}, count=1)
    harness.advance()  # after the read: two start-tasks, one pending with gone-worker
    redis_client.xreadgroup(TASK_GROUP, "gone-worker", {KEYS.tasks("ml"): ">"}, count=1)
    time.sleep(0.6)
    code, data = status(capsys, redis_url, "--stale", "0.5")
    assert code == EXIT_FAILED
    [warning] = [w for w in data["warnings"] if "`ml`" in w]
    assert warning.startswith("2 tasks of kind `ml` waiting, no consumer has read `ml` for ")
    [ml] = data["kinds"]
    assert (ml["group"]["lag"], ml["group"]["pending"]) == (1, 1)


def test_dead_letters_are_a_warning_naming_the_command(
    redis_client: redis.Redis, redis_url: str, capsys: Any, persistent: None
) -> None:
    from rqse.deadletter import PROCESS_ERROR, dead_letter_fields
    from rqse.keys import dead_letter_key

    redis_client.sadd(KEYS.kinds, "ml")
    for n in range(3):
        redis_client.xadd(
            dead_letter_key(KEYS.tasks("ml")),
            dead_letter_fields(
                stream=KEYS.tasks("ml"),
                group=TASK_GROUP,
                consumer="w",
                entry_id=f"{n}-1",
                fields={b"kind": b'"start-task"'},
                reason=PROCESS_ERROR,
                error="boom",
                deliveries=1,
            ),
        )
    code, data = status(capsys, redis_url)
    assert (
        "3 dead letters (tasks of kind `ml`): python -m lifecycle dead-letters list --kind ml"
        in data["warnings"]
    )


def store(client: redis.Redis, workflow_id: str, at: int, **fields: bytes) -> None:
    client.zadd(KEYS.workflows, {workflow_id: at})
    client.hset(KEYS.workflow(workflow_id), mapping={"created": str(at), **fields})  # type: ignore[arg-type]


def test_workflows_are_counted_by_state_and_gone_ones_are_not(
    redis_client: redis.Redis,
) -> None:
    store(redis_client, "run", 1, s=b'{"status": "running"}')
    store(redis_client, "paused", 2, s=b'{"status": "running"}', p=b"[]")
    queued = b'{"key":"k","max":1,"queued":true}'
    store(redis_client, "queued", 2, s=b'{"status": "running"}', p=b"[]", k=queued)
    store(redis_client, "done", 3, s=b'{"status": "finished"}', ended=b"3")
    store(redis_client, "bad", 4, s=b'{"status": "failed"}', ended=b"4")
    store(redis_client, "stop", 5, s=b'{"status": "terminated"}', ended=b"5")
    redis_client.hset(KEYS.stopped, mapping={"bad": "{}", "stop": "{}"})
    redis_client.zadd(KEYS.workflows, {"expired": 6})  # hash removed, id not yet
    redis_client.zadd(KEYS.expiring, {"done": 9_000, "bad": 7_000})
    counts = count_workflows(redis_client, KEYS)
    assert (counts.expiring, counts.next_removal_ms) == (2, 7_000)
    assert counts.states == {
        "running": 1,
        "paused": 1,
        "queued": 1,
        "finished": 1,
        "failed": 1,
        "terminated": 1,
        "corrupt": 0,
    }
    assert (counts.counted, counts.scanned, counts.listed, counts.partial) == (6, 7, 7, False)
    newest = count_workflows(redis_client, KEYS, limit=2)
    assert newest.states["terminated"] == 1 and sum(newest.states.values()) == 1
    assert (newest.scanned, newest.partial) == (2, True)


def test_bad_options_are_one_line(redis_url: str, capsys: Any, tmp_path: Path) -> None:
    code, out, err = run(capsys, "status", "--stale", "0", "--redis-url", redis_url)
    assert (code, out, err) == (2, "", "error: --stale 0: expected seconds above 0\n")


def test_a_reader_group_that_fell_silent_and_a_stalled_archive_are_warnings(
    redis_client: redis.Redis, redis_url: str, capsys: Any, persistent: None
) -> None:
    from lifecycle.keys import RECEIPTS_GROUP, WAIT_EVENTS_GROUP

    for group in (KEYS.lifecycle_group, WAIT_EVENTS_GROUP, RECEIPTS_GROUP):
        redis_client.xgroup_create(KEYS.lifecycle, group, id="0", mkstream=True)
    redis_client.xadd(KEYS.lifecycle, {"kind": b'"ping"'})
    redis_client.xreadgroup(KEYS.lifecycle_group, "lifecycle-1", {KEYS.lifecycle: ">"})
    redis_client.xreadgroup(WAIT_EVENTS_GROUP, "wait-1", {KEYS.lifecycle: ">"}, count=1)
    redis_client.xadd(KEYS.lifecycle, {"kind": b'"ping"'})
    time.sleep(0.6)
    redis_client.xreadgroup(KEYS.lifecycle_group, "lifecycle-1", {KEYS.lifecycle: ">"})
    code, data = status(capsys, redis_url, "--stale", "0.5")
    assert code == EXIT_FAILED
    archive, wait = sorted(data["warnings"], key=lambda w: "wait" in w)
    assert wait.startswith(f"2 entries of {KEYS.lifecycle} waiting for group `wait` (last read ")
    assert wait.endswith(f"(XGROUP DESTROY {KEYS.lifecycle} wait if it is not coming back)")
    assert archive.startswith(
        f"the receipts worker is behind on {KEYS.lifecycle}: 2 entries not archived, the oldest "
    )
    [receipts] = [g for g in data["lifecycle"]["others"] if g["name"] == RECEIPTS_GROUP]
    assert receipts["lag"] == 2 and receipts["oldest_waiting_ms"] >= 500


def test_a_queued_start_task_of_a_terminated_workflow_is_a_note_not_a_warning(
    redis_client: redis.Redis, redis_url: str, capsys: Any, harness: Any, persistent: None
) -> None:
    from lifecycle.client import Client

    harness.submit(compile_text("ml:A"), workflow_id="wf-ended")
    harness.submit(compile_text("ml:B"), workflow_id="wf-runs")
    harness.advance()  # two start-tasks queued on ml, no ml worker
    Client(redis_client).terminate("wf-ended")
    harness.advance()
    code, data = status(capsys, redis_url)
    [ml] = data["kinds"]
    assert (ml["group"]["lag"], ml["ended_queued"], ml["waiting"]) == (2, 1, 1)
    [warning] = data["warnings"]
    assert warning == "1 task of kind `ml` waiting, no worker has ever read `ml`"
    assert data["notes"] == [
        "kind `ml`: 1 queued task of ended workflows (skipped when a worker reads them)"
    ]
    Client(redis_client).terminate("wf-runs")
    harness.advance()
    code, out, _ = run(capsys, "status", "--redis-url", redis_url)
    assert code == EXIT_OK
    assert (
        "note: kind `ml`: 2 queued tasks of ended workflows (skipped when a worker reads them)"
        in out.splitlines()
    )
    assert out.splitlines()[-1] == "no warnings"


def test_the_ended_workflows_check_reads_at_most_the_cap_and_says_so(
    redis_client: redis.Redis, harness: Any, monkeypatch: Any
) -> None:
    from lifecycle import status as status_module
    from lifecycle.client import Client

    monkeypatch.setattr(status_module, "QUEUED_CHECK", 2)
    for n in range(3):
        harness.submit(compile_text("ml:A"), workflow_id=f"wf-{n}")
    harness.advance()
    for n in range(3):
        Client(redis_client).terminate(f"wf-{n}")
    harness.advance()
    found = status_module.read_status(redis_client, KEYS)
    [ml] = found.kinds
    assert (ml.ended_queued, ml.queued_checked, ml.queued_capped, ml.waiting) == (2, 2, True, 1)
    assert found.notes[0].endswith("; only the oldest 2 undelivered were checked")


def test_a_stopped_lifecycle_worker_is_not_alive_once_events_wait_unread(
    redis_client: redis.Redis, redis_url: str, persistent: None
) -> None:
    from lifecycle.status import read_status
    from lifecycle.worker import LifecycleWorker

    pool = redis.ConnectionPool.from_url(redis_url)
    worker = LifecycleWorker(pool=pool, handle_signals=False, block_ms=100)
    import threading

    thread = threading.Thread(target=worker.listen, daemon=True)
    thread.start()
    start_workflow(redis_client, compile_text("A"), None, "wf-1", KEYS)
    deadline = time.monotonic() + 10
    while redis_client.hget(KEYS.workflow("wf-1"), "created") is None:
        assert time.monotonic() < deadline, "the lifecycle worker did not start the workflow"
        time.sleep(0.02)
    worker.stop()
    thread.join(timeout=10)
    pool.disconnect()
    start_workflow(redis_client, compile_text("A"), None, "wf-2", KEYS)
    time.sleep(0.6)
    found = read_status(redis_client, KEYS, read_gap_s=0.5)  # --stale stays 60 s
    assert found.lifecycle_workers == []
    [warning] = [w for w in found.warnings if "lifecycle" in w]
    assert warning.startswith("1 lifecycle event waiting, no lifecycle worker has read for ")
    # Nothing waiting: the same worker, silent as long, is not told apart from an idle one.
    assert read_status(redis_client, KEYS, read_gap_s=60).lifecycle_workers != []


def test_a_kind_whose_workers_stopped_reading_is_a_warning_before_they_go_stale(
    redis_client: redis.Redis, harness: Any, persistent: None
) -> None:
    from lifecycle.status import read_status

    harness.submit(compile_text("ml:A"))
    redis_client.xreadgroup(TASK_GROUP, "ml-1", {KEYS.tasks("ml"): ">"}, count=1)  # nothing yet
    harness.advance()
    time.sleep(0.6)
    found = read_status(redis_client, KEYS, read_gap_s=0.5)
    [warning] = [w for w in found.warnings if "`ml`" in w]
    assert warning.startswith("1 task of kind `ml` waiting, no worker is reading kind `ml` (")
    # A worker busy with a task it holds (pending) and renews is not taken for gone.
    redis_client.xreadgroup(TASK_GROUP, "ml-1", {KEYS.tasks("ml"): ">"}, count=1)
    harness.submit(compile_text("ml:B"))
    harness.advance()
    time.sleep(0.6)
    found = read_status(redis_client, KEYS, read_gap_s=0.5)
    assert [w for w in found.warnings if "`ml`" in w] == []


def test_a_stopped_task_worker_is_a_warning_once_its_kind_has_tasks_waiting(
    redis_client: redis.Redis, redis_url: str, harness: Any, persistent: None
) -> None:
    import threading

    from lifecycle.status import read_status
    from workers.noop import NoopWorker

    harness.submit(compile_text("ml:A"))  # the ml group exists before the worker reads
    harness.advance()
    pool = redis.ConnectionPool.from_url(redis_url)
    worker = NoopWorker(["ml"], pool=pool, handle_signals=False, block_ms=100)
    thread = threading.Thread(target=worker.listen, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while harness.advance() == 0:  # its answer to A
        assert time.monotonic() < deadline, "the ml worker did not answer"
        time.sleep(0.02)
    worker.stop()
    thread.join(timeout=10)
    pool.disconnect()
    harness.submit(compile_text("ml:B"))
    harness.advance()
    time.sleep(0.6)
    found = read_status(redis_client, KEYS, read_gap_s=0.5)
    [warning] = [w for w in found.warnings if "`ml`" in w]
    assert warning.startswith("1 task of kind `ml` waiting, no worker is reading kind `ml` (")
