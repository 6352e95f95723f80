"""Operators' control of workflows: terminate, pause, resume, restart, delete.

Each is an event on the lifecycle stream, applied by the transition like any
other (so it is archived and replayed); the client refuses unknown ids and
states that do not allow the action before sending anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall
from lifecycle.audit.report import audit_archive
from lifecycle.cli import main
from lifecycle.client import Client, Selection
from lifecycle.engine.store import load_workflow
from lifecycle.errors import NotAllowed, UnknownWorkflow
from lifecycle.keys import Keys
from tests.lifecycle.audit_helpers import archive_all
from tests.lifecycle.harness import Harness, decode

KEYS = Keys()


def ok(call: TaskCall) -> Any:
    return {"done": call.name}


def starts(client: redis.Redis, kind: str = "default") -> list[tuple[str, int]]:
    """(name, attempt) of every start-task sent to ``kind``, in order."""
    events = [decode(fields) for _, fields in client.xrange(KEYS.tasks(kind))]
    return [(e["name"], e["attempt"]) for e in events]


def state(client: redis.Redis, workflow_id: str) -> str:
    return Client(client, KEYS).status(workflow_id).state


def test_pause_holds_new_starts_records_ends_and_resume_sends_them_in_order(
    harness: Harness,
) -> None:
    client = Client(harness.client, KEYS)
    harness.submit(compile_text("A → B|C|D → E"), workflow_id="wf")
    harness.advance()
    client.pause("wf")
    harness.advance()
    assert state(harness.client, "wf") == "paused"
    harness.work(ok)  # A ends while paused: recorded, nothing starts
    harness.advance()
    assert [name for name, _ in starts(harness.client)] == ["A"]
    assert load_workflow(harness.client, KEYS, "wf").ends["1"][1] is True
    assert state(harness.client, "wf") == "paused"
    client.resume("wf")
    harness.advance()
    assert [name for name, _ in starts(harness.client)] == ["A", "B", "C", "D"]
    harness.pump(ok)
    assert state(harness.client, "wf") == "finished"


def test_a_repeated_pause_or_resume_changes_nothing(harness: Harness) -> None:
    client = Client(harness.client, KEYS)
    harness.submit(compile_text("A → B"), workflow_id="wf")
    harness.advance()
    assert client.resume("wf").event_id is None  # running: already so
    client.pause("wf")
    harness.advance()
    again = client.pause("wf")
    assert (again.event_id, again.state) == (None, "paused")


def test_terminate_stops_new_starts_and_a_late_end_changes_nothing(harness: Harness) -> None:
    client = Client(harness.client, KEYS)
    harness.submit(compile_text("A → B"), workflow_id="wf")
    harness.advance()
    client.terminate("wf", reason="operator said so")
    harness.advance()
    harness.pump(ok)  # A's end arrives after the terminate
    record = load_workflow(harness.client, KEYS, "wf")
    assert (record.status, record.error) == ("terminated", "operator said so")
    assert [name for name, _ in starts(harness.client)] == ["A"]
    assert harness.client.hexists(KEYS.stopped, "wf")


def test_restart_after_a_failure_reruns_the_failed_task_as_its_next_attempt_not_what_succeeded(
    harness: Harness,
) -> None:
    broken = {"B"}

    def task(call: TaskCall) -> Any:
        if call.name in broken:
            raise RuntimeError(f"{call.name} broke")
        return {"done": call.name}

    harness.submit(compile_text("A → B → C"), workflow_id="wf")
    harness.pump(task)
    assert state(harness.client, "wf") == "failed"
    assert harness.client.hget(KEYS.stopped, "wf") == b'{"2":1}'  # B, attempt 1
    broken.clear()
    Client(harness.client, KEYS).restart("wf")
    harness.pump(task)
    record = load_workflow(harness.client, KEYS, "wf")
    assert record.status == "finished" and record.error is None
    assert starts(harness.client) == [("A", 1), ("B", 1), ("B", 2), ("C", 1)]
    assert not harness.client.hexists(KEYS.stopped, "wf")  # finished: the record went


def test_restart_gives_the_task_a_fresh_retry_budget(harness: Harness) -> None:
    failures = {"B": 3}

    def task(call: TaskCall) -> Any:
        if failures.get(call.name, 0) > 0:
            failures[call.name] -= 1
            raise RuntimeError("not yet")
        return {}

    harness.submit(compile_text("A → B (- {$retries: 1} -)"), workflow_id="wf")
    harness.pump(task)
    assert state(harness.client, "wf") == "failed"  # attempts 1 and 2 failed
    Client(harness.client, KEYS).restart("wf")
    harness.pump(task)  # attempt 3 fails, its retry (4) succeeds
    assert state(harness.client, "wf") == "finished"
    assert [attempt for name, attempt in starts(harness.client) if name == "B"] == [1, 2, 3, 4]


def test_a_paused_then_terminated_workflow_restarts_what_was_held(harness: Harness) -> None:
    client = Client(harness.client, KEYS)
    harness.submit(compile_text("A → B|C"), workflow_id="wf")
    harness.advance()
    client.pause("wf")
    harness.advance()
    harness.work(ok)
    harness.advance()  # B and C held
    client.terminate("wf")
    harness.advance()
    assert state(harness.client, "wf") == "terminated"
    client.restart("wf")
    harness.pump(ok)
    assert state(harness.client, "wf") == "finished"
    assert starts(harness.client) == [("A", 1), ("B", 2), ("C", 2)]


def test_delete_removes_an_ended_workflow_and_its_id_is_unknown_after(harness: Harness) -> None:
    client = Client(harness.client, KEYS)
    harness.submit(compile_text("A"), workflow_id="wf")
    harness.pump(ok)
    client.delete("wf")
    harness.advance()
    assert not harness.client.exists(KEYS.workflow("wf"))
    assert harness.client.zscore(KEYS.workflows, "wf") is None
    with pytest.raises(UnknownWorkflow):
        client.status("wf")


def test_the_client_refuses_what_the_state_does_not_allow_before_sending(
    harness: Harness,
) -> None:
    client = Client(harness.client, KEYS)
    harness.submit(compile_text("A"), workflow_id="wf")
    harness.advance()
    length = harness.client.xlen(KEYS.lifecycle)
    with pytest.raises(NotAllowed, match="running"):
        client.delete("wf")
    with pytest.raises(NotAllowed, match="running"):
        client.restart("wf")
    harness.pump(ok)
    length = harness.client.xlen(KEYS.lifecycle)
    with pytest.raises(NotAllowed, match="finished"):
        client.pause("wf")
    with pytest.raises(UnknownWorkflow):
        client.terminate("wf-typo")
    assert harness.client.xlen(KEYS.lifecycle) == length
    assert not harness.client.exists(KEYS.workflow("wf-typo"))


def test_the_lifecycle_also_refuses_a_control_the_state_does_not_allow(harness: Harness) -> None:
    harness.submit(compile_text("A"), workflow_id="wf")
    harness.pump(ok)
    event = {"kind": "pause-workflow", "workflow": "wf"}
    harness.client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in event.items()})
    reply = harness.client.xreadgroup(KEYS.lifecycle_group, "t", {KEYS.lifecycle: ">"})
    entries = [(i.decode(), decode(f)) for _, items in reply for i, f in items]
    result = harness.advancer.apply(entries)
    assert len(result.rejected) == 1 and "finished" in result.rejected[0][1]
    assert state(harness.client, "wf") == "finished"


def test_bulk_terminate_by_filter_reaches_every_matching_workflow(harness: Harness) -> None:
    client = Client(harness.client, KEYS)
    graph, other = compile_text("@flow slow\nA → B"), compile_text("@flow other\nA → B")
    for n in range(30):
        harness.submit(graph, workflow_id=f"slow-{n}")
    harness.submit(other, workflow_id="other-0")
    harness.advance()
    chosen = list(client.select(Selection(state="running", flow="slow")))
    sent, refused = client.control_many("terminate-workflow", chosen, "bulk")
    assert len(sent) == 30 and not refused
    harness.advance()
    assert {state(harness.client, f"slow-{n}") for n in range(30)} == {"terminated"}
    assert state(harness.client, "other-0") == "running"


# -- the command line -------------------------------------------------------------------


@pytest.fixture
def url_args(redis_url: str) -> list[str]:
    return ["--redis-url", redis_url]


def test_cli_control_exit_codes_unknown_2_not_allowed_1(
    harness: Harness, url_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    harness.submit(compile_text("A"), workflow_id="wf")
    harness.pump(ok)
    assert main(["pause", "nope", *url_args]) == 2
    assert "no workflow 'nope'" in capsys.readouterr().err
    assert main(["pause", "wf", *url_args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "finished" in err
    assert main(["terminate", *url_args]) == 2  # neither ids nor a filter


def test_cli_terminate_waits_for_the_lifecycle_and_prints_the_new_state(
    engine: Any, redis_client: redis.Redis, url_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    Client(redis_client, KEYS).submit(compile_text("wait:delay (- {seconds: 30} -)"), None, "wf")
    from tests.conftest import wait_until

    wait_until(lambda: Client(redis_client, KEYS).exists("wf"))
    assert main(["terminate", "wf", "--reason", "enough", *url_args]) == 0
    assert capsys.readouterr().out.strip() == "workflow wf: terminated"
    assert main(["terminate", "wf", *url_args]) == 0
    assert "already terminated" in capsys.readouterr().out


def test_cli_says_when_no_lifecycle_worker_applies_it(
    harness: Harness, url_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    harness.submit(compile_text("A"), workflow_id="wf")
    harness.advance()
    assert main(["pause", "wf", "--timeout", "0.2", *url_args]) == 1
    assert "is a lifecycle worker running?" in capsys.readouterr().err


# -- audit ------------------------------------------------------------------------------


def test_replay_reproduces_workflows_that_were_paused_resumed_terminated_and_restarted(
    harness: Harness, tmp_path: Path
) -> None:
    client = Client(harness.client, KEYS)
    fail = {"B"}

    def task(call: TaskCall) -> Any:
        if call.name in fail:
            raise RuntimeError("broke")
        return {"n": call.name}

    harness.submit(compile_text("A → B|C → D"), workflow_id="w1")
    harness.advance()
    client.pause("w1")
    harness.advance()
    harness.work(task)
    harness.advance()
    client.resume("w1")
    harness.pump(task)  # B fails
    fail.clear()
    client.restart("w1")
    harness.pump(task)
    harness.submit(compile_text("A → B"), workflow_id="w2")
    harness.advance()
    client.terminate("w2")
    harness.pump(task)
    client.restart("w2")
    harness.pump(task)
    assert state(harness.client, "w1") == state(harness.client, "w2") == "finished"
    archive_all(harness.client, tmp_path / "archive")
    report = audit_archive(tmp_path / "archive", KEYS, client=harness.client)
    assert report.ok, report.first_problem
    assert {w.live for w in report.workflows} == {"equal"}


# -- races ------------------------------------------------------------------------------


def test_pause_and_resume_racing_many_concurrent_enders_never_double_start_or_lose_an_end(
    redis_client: redis.Redis, pool: redis.ConnectionPool, in_threads: Any
) -> None:
    from lifecycle.worker import LifecycleWorker
    from tests.conftest import wait_until
    from workers.noop import NoopWorker

    options = {"pool": pool, "handle_signals": False, "block_ms": 20}
    in_threads(*[LifecycleWorker(batch_size=50, **options) for _ in range(2)])
    in_threads(*[NoopWorker(["default"], batch_size=10, **options) for _ in range(4)])
    client = Client(redis_client, KEYS)
    items = list(range(6000))
    client.submit(compile_text("A → * B → C"), items, "wf")
    wait_until(lambda: client.exists("wf"))
    toggles = 0
    while client.status("wf").state in ("running", "paused") and toggles < 400:
        current = client.status("wf").state
        try:
            if current == "running":
                client.pause("wf", wait=5)
            else:
                client.resume("wf", wait=5)
        except NotAllowed:
            break  # it finished between the read and the action
        toggles += 1
    if client.status("wf").state == "paused":
        client.resume("wf")
    wait_until(lambda: client.status("wf").state == "finished", timeout=60)
    assert toggles >= 2  # the race was on: it was paused and resumed while tasks ended
    ids = [decode(f)["id"] for _, f in redis_client.xrange(KEYS.tasks("default"))]
    assert len(ids) == len(set(ids)) == len(items) + 2  # A, every B, C: each started once
    record = load_workflow(redis_client, KEYS, "wf")
    wrong = [(n, got) for n, got in enumerate(record.output or []) if got != n]
    assert record.output and not wrong, wrong[:5]  # every B's end was recorded, in place


def test_a_resume_and_a_pause_in_one_batch_leave_the_workflow_paused(harness: Harness) -> None:
    client = Client(harness.client, KEYS)
    harness.submit(compile_text("A → B"), workflow_id="wf")
    harness.advance()
    client.pause("wf")
    harness.advance()
    client.resume("wf")
    client.pause("wf")  # the client sees it still paused: a repeat, nothing sent
    for event in ({"kind": "resume-workflow", "workflow": "wf"},
                  {"kind": "pause-workflow", "workflow": "wf"}):  # fmt: skip
        harness.client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in event.items()})
    harness.advance()
    assert state(harness.client, "wf") == "paused"
    harness.work(ok)
    harness.advance()
    assert [name for name, _ in starts(harness.client)] == ["A"]  # B held


def test_bulk_terminate_and_restart_racing_task_ends_start_each_attempt_once_and_all_finish(
    redis_client: redis.Redis, pool: redis.ConnectionPool, in_threads: Any
) -> None:
    from lifecycle.worker import LifecycleWorker
    from tests.conftest import wait_until
    from workers.noop import NoopWorker

    options = {"pool": pool, "handle_signals": False, "block_ms": 20}
    in_threads(*[LifecycleWorker(batch_size=50, **options) for _ in range(2)])
    in_threads(*[NoopWorker(["default"], batch_size=5, **options) for _ in range(3)])
    client = Client(redis_client, KEYS)
    graph = compile_text("@flow chain\n" + " → ".join(f"T{n}" for n in range(100)))
    ids = [f"c{n}" for n in range(60)]
    for workflow_id in ids:
        client.submit(graph, {"w": workflow_id}, workflow_id)
    wait_until(lambda: all(client.exists(w) for w in ids))
    restarted = 0
    for _ in range(5):
        running = list(client.select(Selection(state="running", flow="chain")))
        client.control_many("terminate-workflow", running, "round")
        wait_until(lambda: not list(client.select(Selection(state="running"))))
        stopped = list(client.select(Selection(state="terminated")))
        sent, _ = client.control_many("restart-workflow", stopped)
        restarted += len(sent)
    wait_until(lambda: {client.status(w).state for w in ids} == {"finished"}, timeout=60)
    assert restarted >= len(ids) // 2  # the race was on: many were stopped and restarted
    started = [decode(f)["id"] for _, f in redis_client.xrange(KEYS.tasks("default"))]
    assert len(started) == len(set(started))  # no attempt was started twice
    for workflow_id in ids:
        assert load_workflow(redis_client, KEYS, workflow_id).output == {"w": workflow_id}


def test_a_start_held_and_resumed_in_one_batch_is_sent_with_its_input(harness: Harness) -> None:
    client = Client(harness.client, KEYS)
    harness.submit(compile_text("A → B"), {"x": 1}, workflow_id="wf")
    harness.advance()
    client.pause("wf")
    harness.advance()
    harness.work(ok)  # A's end and the resume reach the lifecycle in one batch
    client.resume("wf")
    harness.advance()
    sent = [decode(f) for _, f in harness.client.xrange(KEYS.tasks("default"))]
    assert [(e["name"], e["input"]) for e in sent] == [("A", {"x": 1}), ("B", {"done": "A"})]


def test_a_start_sent_terminated_and_restarted_in_one_batch_keeps_its_input(
    harness: Harness,
) -> None:
    harness.submit(compile_text("A → B"), {"x": 1}, workflow_id="wf")
    harness.advance()
    harness.work(ok)  # A's end (B starts), a terminate and a restart: one batch
    for kind in ("terminate-workflow", "restart-workflow"):
        event = {"kind": kind, "workflow": "wf"}
        harness.client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in event.items()})
    harness.advance()
    sent = [decode(f) for _, f in harness.client.xrange(KEYS.tasks("default"))]
    assert [(e["name"], e["attempt"], e["input"]) for e in sent] == [
        ("A", 1, {"x": 1}), ("B", 1, {"done": "A"}), ("B", 2, {"done": "A"})
    ]  # fmt: skip


def test_a_paused_workflow_whose_last_task_ends_finishes_and_is_no_longer_paused(
    harness: Harness,
) -> None:
    client = Client(harness.client, KEYS)
    harness.submit(compile_text("A"), workflow_id="wf")
    harness.advance()
    client.pause("wf")
    harness.advance()
    harness.pump(ok)
    assert state(harness.client, "wf") == "finished"
    assert harness.client.hget(KEYS.workflow("wf"), "p") is None


def raw(harness: Harness, *events: dict[str, Any]) -> None:
    """Lifecycle events as any writer could send them: no client check first."""
    for event in events:
        harness.client.xadd(KEYS.lifecycle, {k: orjson.dumps(v) for k, v in event.items()})


def test_a_terminate_for_an_id_with_no_record_creates_nothing(harness: Harness) -> None:
    raw(harness, {"kind": "terminate-workflow", "workflow": "gone", "reason": "late"})
    harness.advance()
    assert not harness.client.exists(KEYS.workflow("gone"))
    assert harness.client.zscore(KEYS.workflows, "gone") is None


def test_a_start_after_a_delete_in_one_batch_runs_the_id_afresh(harness: Harness) -> None:
    from lifecycle.events import start_workflow as start_event

    harness.submit(compile_text("A"), {"run": 1}, workflow_id="wf")
    harness.pump(ok)
    graph = harness.client.hget(KEYS.workflow("wf"), "g").decode()
    raw(
        harness, {"kind": "delete-workflow", "workflow": "wf"}, start_event("wf", graph, {"run": 2})
    )
    harness.advance()
    assert state(harness.client, "wf") == "running"
    assert load_workflow(harness.client, KEYS, "wf").input == {"run": 2}
    harness.pump(ok)
    assert state(harness.client, "wf") == "finished"


def test_a_corrupt_record_can_be_deleted(harness: Harness) -> None:
    key = KEYS.workflow("bad")
    harness.client.hset(key, mapping={"s": "not json", "v": "3", "ended": "1"})
    harness.client.zadd(KEYS.workflows, {"bad": 5})
    Client(harness.client, KEYS).delete("bad")
    harness.advance()
    assert not harness.client.exists(key) and harness.client.zscore(KEYS.workflows, "bad") is None


def test_select_reaches_every_workflow_while_others_leave_the_index(harness: Harness) -> None:
    client = Client(harness.client, KEYS)
    graph = compile_text("@flow keep\nA → B")
    for n in range(1200):  # several pages, many sharing a creation millisecond
        harness.submit(graph, workflow_id=f"k{n:04d}")
    while harness.advance():
        pass
    harness.client.zadd(KEYS.workflows, {f"k{n:04d}": 5 for n in range(600, 1200)})  # ties
    seen = []
    for status in client.select(Selection(state="running")):
        seen.append(status.id)
        if len(seen) == 10:  # workflows read already leave while the selection pages on
            harness.client.zrem(KEYS.workflows, *[f"k{n:04d}" for n in range(600, 1000)])
    assert len(set(seen)) == len(seen)
    assert set(seen) >= {f"k{n:04d}" for n in (*range(0, 600), *range(1000, 1200))}


def test_a_record_with_a_garbled_version_does_not_stop_a_bulk_action(harness: Harness) -> None:
    harness.submit(compile_text("A → B"), workflow_id="ok")
    harness.advance()
    harness.client.hset(KEYS.workflow("bad"), mapping={"s": '{"status": "running"}', "v": "x"})
    harness.client.zadd(KEYS.workflows, {"bad": 1})
    found = {s.id for s in Client(harness.client, KEYS).select(Selection(state="running"))}
    assert found == {"ok", "bad"}


def test_after_terminate_and_restart_a_worker_runs_the_new_attempt_not_the_stopped_one(
    harness: Harness, redis_url: str
) -> None:
    from workers.noop import NoopWorker

    client = Client(harness.client, KEYS)
    harness.submit(compile_text("A"), workflow_id="wf")
    harness.advance()  # A attempt 1 queued; nobody has read it
    client.terminate("wf")
    harness.advance()
    client.restart("wf")
    harness.advance()  # A attempt 2 queued behind it
    worker = NoopWorker(["default"], pool=harness.client.connection_pool, handle_signals=False)
    assert worker.listen(max_events=2, idle_timeout=1.0) == 2
    assert worker.stats.ignored == 1  # attempt 1: stopped, skipped
    harness.advance()
    assert state(harness.client, "wf") == "finished"
    assert not harness.client.exists(KEYS.lifecycle + ":dead")  # no stale answer to refuse
