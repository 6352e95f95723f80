"""Packed start-tasks (one ``start-tasks`` entry per task stream and transaction) in the
archive and the streams: replay, recover, history, status and the dead-lettered-task
answerer see each task of a pack as the start-task it stands for."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall
from lifecycle import events as ev
from lifecycle.audit.recover import recover
from lifecycle.audit.replay import NOT_IN_REDIS
from lifecycle.audit.report import audit_archive
from lifecycle.client import Client
from lifecycle.dead_letters import list_dead_letters, requeue
from lifecycle.engine.dead_tasks import DeadTasks
from lifecycle.engine.store import load_workflow
from lifecycle.history import inspected, live_history, lost_streams
from lifecycle.inspect import read_workflow
from lifecycle.keys import TASK_GROUP
from lifecycle.status import read_status
from rqse import EventListener
from rqse.deadletter import PROCESS_ERROR, dead_letter_fields
from rqse.keys import dead_letter_key
from tests.lifecycle.audit_helpers import (
    FLOW,
    KEYS,
    archive_all,
    find_line,
    flaky,
    flow_input,
    rewrite,
)
from tests.lifecycle.harness import Harness, decode


def packed_harness(client: redis.Redis) -> Harness:
    """The harness with a lifecycle that packs every kind's start-tasks (the Advancer's
    ``pack_starts``); its task worker runs each task of a pack as its own."""
    return Harness(client, KEYS, pack_starts=True)


def echo(call: TaskCall) -> Any:
    return {"by": call.name, "in": call.input}


def packs(client: redis.Redis, kind: str = "default") -> list[tuple[str, list[dict[str, Any]]]]:
    """The start-tasks entries of ``kind``'s stream: (id, the start-tasks it stands for)."""
    found = []
    for raw_id, fields in client.xrange(KEYS.tasks(kind)):
        if ev.is_start_tasks(fields.get(b"kind")):
            entry_id = raw_id.decode()
            found.append((entry_id, ev.unpacked_starts(entry_id, decode(fields))))
    return found


def task_piece(workflow: str, key: str, token: str = "t0", name: str = "A") -> bytes:
    """One task of a pack as the lifecycle writes it (start_task_piece, filled)."""
    template = ev.start_task_template(KEYS.tasks("default"), name, 1, {}, None)
    values = (workflow, key, 1, f"{workflow}/{key}/1", token, {"n": 1})
    return ev.start_task_piece(template) % tuple(orjson.dumps(v) for v in values)


# -- Replay ---------------------------------------------------------------------------


@pytest.fixture
def packed_archive(redis_client: redis.Redis, tmp_path: Path) -> tuple[list[str], Path]:
    """30 workflows of the every-feature flow (retries included) run with packed
    start-tasks, then archived."""
    harness = packed_harness(redis_client)
    graph = compile_text(FLOW)
    ids = [harness.submit(graph, flow_input(n), f"w{n}") for n in range(30)]
    harness.pump(flaky)
    assert max(len(tasks) for _, tasks in packs(redis_client)) >= 30  # the As, in one
    archive_all(redis_client, tmp_path / "archive")
    return ids, tmp_path / "archive"


def test_replay_of_a_run_whose_start_tasks_went_packed_agrees_with_live(
    packed_archive: tuple[list[str], Path], redis_client: redis.Redis
) -> None:
    ids, directory = packed_archive
    report = audit_archive(directory, KEYS, client=redis_client)
    assert report.ok, report.first_problem
    assert sorted(w.workflow for w in report.workflows) == sorted(ids)
    assert {w.live for w in report.workflows} == {"equal"}
    assert {w.state.status for w in report.workflows if w.state} == {"finished"}
    # Every task of every pack is checked, as the start-task it stands for.
    pack_ids = {(KEYS.tasks("default"), entry_id) for entry_id, _ in packs(redis_client)}
    checked = [e for w in report.workflows for e in w.emitted if (e[0], e[1]) in pack_ids]
    assert len(checked) == sum(len(tasks) for _, tasks in packs(redis_client))
    assert {entry[2]["kind"] for entry in checked} == {ev.START_TASK}


def _pack_holding(workflow: str):
    def predicate(record: dict[str, Any]) -> bool:
        event = record.get("event") or {}
        return event.get("kind") == ev.START_TASKS and any(
            task.get("workflow") == workflow for task in event["tasks"]
        )

    return predicate


def _forge_input(tasks: list[dict[str, Any]], workflow: str) -> None:
    (task,) = [t for t in tasks if t["workflow"] == workflow][:1]
    task["input"] = {"forged": True}


def _drop(tasks: list[dict[str, Any]], workflow: str) -> None:
    tasks.remove(next(t for t in tasks if t["workflow"] == workflow))


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_forge_input, "field 'input' is {\"forged\":true} in the archive, replay computes"),
        (_drop, "the archive never did"),
    ],
    ids=["altered", "left-out"],
)
def test_a_task_altered_or_left_out_of_an_archived_pack_diverges_its_workflow_only(
    packed_archive: tuple[list[str], Path], change: Any, said: str
) -> None:
    _, directory = packed_archive
    changed: dict[str, Any] = {}

    def alter(lines: list[bytes]) -> list[bytes]:
        number = find_line(lines, _pack_holding("w5"))
        record = orjson.loads(lines[number])
        change(record["event"]["tasks"], "w5")
        changed.update(record)
        lines[number] = orjson.dumps(record)
        return lines

    rewrite(directory, alter)
    report = audit_archive(directory, KEYS)
    (diverged,) = report.diverged  # the pack's other workflows replay equal
    assert diverged.workflow == "w5"
    assert diverged.divergence is not None and said in diverged.divergence.message
    assert "start-task w5/" in diverged.divergence.message or "starts w5/" in (
        diverged.divergence.message
    )
    assert len(changed["event"]["tasks"]) > 1


def test_a_malformed_task_of_an_archived_pack_leaves_the_others_replayed_equal(
    packed_archive: tuple[list[str], Path],
) -> None:
    _, directory = packed_archive

    def spoil(lines: list[bytes]) -> list[bytes]:
        number = find_line(lines, _pack_holding("w9"))
        record = orjson.loads(lines[number])
        tasks = record["event"]["tasks"]
        at = next(n for n, t in enumerate(tasks) if t["workflow"] == "w9")
        tasks[at] = {**tasks[at], "name": 7}  # parse_start_tasks leaves it out
        lines[number] = orjson.dumps(record)
        return lines

    rewrite(directory, spoil)
    report = audit_archive(directory, KEYS)
    assert [w.workflow for w in report.diverged] == ["w9"]
    assert report.diverged[0].divergence is not None
    assert "the archive never did" in report.diverged[0].divergence.message


# -- Recover --------------------------------------------------------------------------


def test_recover_sends_a_task_found_only_in_a_pack_again_as_one_start_task(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    flow = compile_text("A → B → C (- $timeout: 3600 -)")
    harness = packed_harness(redis_client)
    ids = [harness.submit(flow, {"n": n}, f"w{n}") for n in range(4)]
    harness.advance()
    harness.work(echo)
    harness.advance()  # every B running, its start-task in one pack
    [(_, b_tasks)] = [(i, t) for i, t in packs(redis_client) if t[0]["name"] == "B"]
    assert sorted(t["workflow"] for t in b_tasks) == ids
    archive_all(redis_client, tmp_path / "archive")
    for workflow in ids:
        redis_client.delete(KEYS.workflow(workflow))
    before = audit_archive(tmp_path / "archive", KEYS, client=redis_client)
    assert before.ok, before.first_problem
    assert {w.workflow: w.live for w in before.lost} == dict.fromkeys(ids, NOT_IN_REDIS)

    report = recover(redis_client, tmp_path / "archive", KEYS)
    assert sorted(report.restored) == ids and report.skipped == []
    assert report.resent == 4
    # Each sent again alone, as the start-task it was in the pack, marked recovered.
    resent = [decode(f) for _, f in redis_client.xrange(KEYS.tasks("default"))][-4:]
    by_workflow = sorted(b_tasks, key=lambda t: t["workflow"])
    assert sorted(resent, key=lambda r: r["workflow"]) == list(map(ev.sent_again, by_workflow))
    harness.pump(echo)
    for workflow in ids:
        assert load_workflow(redis_client, KEYS, workflow).status == "finished"
    archive_all(redis_client, tmp_path / "archive")
    after = audit_archive(tmp_path / "archive", KEYS, client=redis_client)
    assert after.ok, after.first_problem
    assert set(after.live) == {"equal"}


# -- History --------------------------------------------------------------------------


def _run_fan_out(client: redis.Redis, count: int = 3) -> Harness:
    harness = packed_harness(client)
    for n in range(count):
        harness.submit(compile_text("A → { B C } → D"), {"n": n}, f"p{n}")
    harness.pump(echo)
    return harness


def test_history_shows_each_task_of_a_pack_as_its_start_task_live_and_from_the_archive(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    _run_fan_out(redis_client)
    pack_ids = {entry_id for entry_id, _ in packs(redis_client)}
    live = live_history(redis_client, KEYS, "p1")
    assert live["complete"] and live["corrupt"] == []
    starts = [row for row in live["timeline"] if row["event"] == ev.START_TASK]
    assert sorted(row["name"] for row in starts) == ["A", "B", "C", "D"]
    assert {row["entry"] for row in starts} <= pack_ids  # under the pack's id
    assert {row["stream"] for row in starts} == {KEYS.tasks("default")}
    # Each start before the answer to it (one millisecond may hold both), names carried
    # to the answers.
    events = [(row["event"], row.get("name")) for row in live["timeline"]]
    for name in "ABCD":
        assert events.index(("start-task", name)) < events.index(("end-task", name))
    archive_all(redis_client, tmp_path)
    for stream in (KEYS.lifecycle, KEYS.tasks("default")):
        redis_client.xtrim(stream, maxlen=0)
    again = live_history(redis_client, KEYS, "p1", archive=tmp_path)
    assert again["complete"]
    assert [r for r in again["timeline"] if r["event"] == ev.START_TASK] == [
        {**row, "archived": True} for row in starts
    ]


def test_a_task_stream_that_lost_other_entries_still_holds_a_packed_workflows_starts(
    redis_client: redis.Redis,
) -> None:
    _run_fan_out(redis_client)
    stream = KEYS.tasks("default")
    redis_client.xdel(stream, redis_client.xadd(stream, {"kind": b'"filler"'}))  # lost one
    assert inspected(redis_client, KEYS, "p1")["timeline_lost"] == []
    # Once a pack holding one of its start-tasks is gone, the stream lost part of it.
    (first, _) = next((i, t) for i, t in packs(redis_client) if "p1" in {s["workflow"] for s in t})
    redis_client.xdel(stream, first)
    assert lost_streams(redis_client, KEYS, read_workflow(redis_client, KEYS, "p1")) == [stream]


def test_history_names_a_pack_whose_tasks_cannot_be_read_in_one_line(
    redis_client: redis.Redis,
) -> None:
    _run_fan_out(redis_client, 1)
    stream = KEYS.tasks("default")
    not_list = redis_client.xadd(
        stream, {"kind": b'"start-tasks"', "tasks": b'{"workflow":"p0","name":"A"}'}
    ).decode()
    not_json = redis_client.xadd(
        stream, {"kind": b'"start-tasks"', "tasks": b'[{"workflow":"p0",'}
    ).decode()
    corrupt = live_history(redis_client, KEYS, "p0")["corrupt"]
    assert len(corrupt) == 2
    assert corrupt[0].startswith(
        f"corrupt entry {stream} {not_list}: event {not_list} (start-tasks): field 'tasks' is "
    )
    assert corrupt[0].endswith("expected list")
    assert corrupt[1].startswith(f"corrupt entry {stream} {not_json}: field tasks: not JSON")
    assert all("\n" not in line for line in corrupt)


# -- Status ---------------------------------------------------------------------------


def test_a_queued_pack_counts_as_one_ended_entry_only_once_every_task_is_of_an_ended_workflow(
    redis_client: redis.Redis,
) -> None:
    harness = packed_harness(redis_client)
    harness.submit(compile_text("ml:A"), workflow_id="wf-1")
    harness.submit(compile_text("ml:A"), workflow_id="wf-2")
    harness.advance()  # one pack of two on ml, no ml worker
    harness.submit(compile_text("ml:A"), workflow_id="wf-3")
    harness.advance()  # a pack of one
    assert [len(tasks) for _, tasks in packs(redis_client, "ml")] == [2, 1]
    for workflow in ("wf-1", "wf-3"):
        Client(redis_client).terminate(workflow)
    harness.advance()

    def ml() -> Any:
        return read_status(redis_client, KEYS).kinds[0]

    # The first pack still has wf-2's task to run: work waiting; the second none.
    assert (ml().group.lag, ml().ended_queued, ml().waiting) == (2, 1, 1)
    Client(redis_client).terminate("wf-2")
    harness.advance()
    assert (ml().group.lag, ml().ended_queued, ml().waiting) == (2, 2, 0)


# -- Dead letters ---------------------------------------------------------------------


class Crashes(EventListener):
    """A task worker whose process() raises: rqse dead-letters the entry at once."""

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        raise RuntimeError("model file missing")


def _dead_letter_the_pack(
    client: redis.Redis, redis_url: str, count: int, **options: Any
) -> tuple[Harness, list[str]]:
    """``count`` workflows of ``ml:A → B`` whose start-tasks went in one pack, which a
    crashing ml worker dead-letters."""
    harness = packed_harness(client)
    ids = [harness.submit(compile_text("ml:A → B"), {"n": n}, f"d{n}") for n in range(count)]
    harness.advance()
    [(_, tasks)] = packs(client, "ml")
    assert len(tasks) == count
    pool = redis.ConnectionPool.from_url(redis_url)
    try:
        Crashes(
            KEYS.tasks("ml"), TASK_GROUP, pool=pool, handle_signals=False, max_deliveries=1,
            **options,
        ).listen(idle_timeout=0.3)  # fmt: skip
    finally:
        pool.disconnect()
    assert client.xlen(dead_letter_key(KEYS.tasks("ml"))) == 1
    return harness, ids


def _answer_dead_letters(redis_url: str, events: int = 1) -> None:
    pool = redis.ConnectionPool.from_url(redis_url)
    try:
        listener = DeadTasks(KEYS, pool=pool, block_ms=50)
        assert listener.listen(max_events=events, idle_timeout=2.0) == events
    finally:
        pool.disconnect()


def _failures(client: redis.Redis) -> list[dict[str, Any]]:
    events = [decode(fields) for _, fields in client.xrange(KEYS.lifecycle)]
    return [e for e in events if e["kind"] == ev.END_TASK and e["status"] == "FAILURE"]


def test_a_dead_lettered_pack_fails_each_of_its_tasks_once(
    redis_client: redis.Redis, redis_url: str
) -> None:
    harness, ids = _dead_letter_the_pack(redis_client, redis_url, 3)
    [(_, tasks)] = packs(redis_client, "ml")
    _answer_dead_letters(redis_url)
    failures = _failures(redis_client)
    assert sorted((f["workflow"], f["key"], f["attempt"], f["token"]) for f in failures) == sorted(
        (t["workflow"], t["key"], t["attempt"], t["token"]) for t in tasks
    )
    harness.advance()
    error = "start-task dead-lettered (process-error): RuntimeError: model file missing"
    for workflow in ids:
        record = load_workflow(redis_client, KEYS, workflow)
        assert record.status == "failed", workflow
        assert error in str(record.error)


def test_an_oversize_dead_lettered_pack_is_answered_from_its_stream(
    redis_client: redis.Redis, redis_url: str
) -> None:
    harness, ids = _dead_letter_the_pack(redis_client, redis_url, 2, max_entry_bytes=200)
    [letter] = list_dead_letters(redis_client, KEYS)
    assert letter.reason == "oversize" and letter.fields is None
    _answer_dead_letters(redis_url)
    assert sorted(f["workflow"] for f in _failures(redis_client)) == ids
    harness.advance()
    assert {load_workflow(redis_client, KEYS, w).status for w in ids} == {"failed"}


def _dead_pack(client: redis.Redis, tasks: bytes, entry_id: str = "5-0") -> str:
    client.sadd(KEYS.kinds, "default")
    fields = dead_letter_fields(
        stream=KEYS.tasks("default"),
        group=TASK_GROUP,
        consumer="w1",
        entry_id=entry_id,
        fields={b"kind": b'"start-tasks"', b"tasks": tasks},
        reason=PROCESS_ERROR,
        error="RuntimeError: boom",
        deliveries=1,
    )
    return client.xadd(dead_letter_key(KEYS.tasks("default")), fields).decode()


def test_a_malformed_task_of_a_dead_lettered_pack_is_one_warning_and_the_others_fail(
    redis_client: redis.Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = b"[%b,7,%b,%b]" % (
        task_piece("wf-a", "1", "ta"),
        b'{"workflow":"wf-x","name":"A"}',  # no key: nothing to answer
        task_piece("wf-b", "2", "tb"),
    )
    dead = _dead_pack(redis_client, tasks)
    with caplog.at_level(logging.WARNING, logger="lifecycle.engine.dead_tasks"):
        _answer_dead_letters(redis_url)
    failures = _failures(redis_client)
    assert [(f["workflow"], f["key"], f["token"]) for f in failures] == [
        ("wf-a", "1", "ta"),
        ("wf-b", "2", "tb"),
    ]
    lines = [r.getMessage() for r in caplog.records if r.name == "lifecycle.engine.dead_tasks"]
    assert lines == [
        f"dead letter {dead} of {dead_letter_key(KEYS.tasks('default'))}: event 5-0 "
        "(start-tasks): task 1 is 7, expected an object with string 'workflow' and 'name'; "
        "that task skipped, nothing answered for it",
        f"dead letter {dead} of {dead_letter_key(KEYS.tasks('default'))}: a task of "
        "start-tasks without string workflow and key: 'wf-x', None; that task skipped, "
        "nothing answered for it",
    ]
    assert (
        redis_client.xpending(dead_letter_key(KEYS.tasks("default")), "lifecycle")["pending"] == 0
    )


@pytest.mark.parametrize(
    ("tasks", "said"),
    [
        (b'{"workflow":"wf"}', "event 5-0 (start-tasks): field 'tasks' is {'workflow': 'wf'}"),
        (b'[{"workflow":', "start-tasks field 'tasks' not JSON"),
    ],
    ids=["not-a-list", "not-json"],
)
def test_a_dead_lettered_pack_whose_tasks_cannot_be_read_is_one_warning(
    redis_client: redis.Redis,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
    tasks: bytes,
    said: str,
) -> None:
    dead = _dead_pack(redis_client, tasks)
    with caplog.at_level(logging.WARNING, logger="lifecycle.engine.dead_tasks"):
        _answer_dead_letters(redis_url)
    assert _failures(redis_client) == []
    [line] = [r.getMessage() for r in caplog.records if r.name == "lifecycle.engine.dead_tasks"]
    assert line.startswith(f"dead letter {dead} of ") and said in line
    assert line.endswith("; acknowledged, nothing answered") and "\n" not in line


def test_a_requeued_pack_goes_back_as_it_was_and_each_of_its_tasks_runs(
    redis_client: redis.Redis, redis_url: str
) -> None:
    harness, ids = _dead_letter_the_pack(redis_client, redis_url, 3)
    [(original_id, tasks)] = packs(redis_client, "ml")
    [letter] = list_dead_letters(redis_client, KEYS)
    done = requeue(redis_client, letter)
    assert done.new_id is not None
    [(again_id, again)] = [(i, t) for i, t in packs(redis_client, "ml") if i != original_id]
    assert again_id == done.new_id and again == tasks
    assert harness.work(echo) == 3
    harness.pump(echo)
    assert {load_workflow(redis_client, KEYS, w).status for w in ids} == {"finished"}
