"""Replay from the archive alone: the same result as live, and tampering reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle import events as ev
from lifecycle.audit.replay import ArchiveGraphs, WorkflowReplay, replay_workflow
from lifecycle.audit.report import audit_archive
from lifecycle.cli import main
from tests.lifecycle.audit_helpers import (
    KEYS,
    archive_all,
    find_line,
    rewrite,
    run_in_harness,
)
from tests.lifecycle.harness import Harness


@pytest.fixture
def archived(redis_client: redis.Redis, tmp_path: Path) -> tuple[list[str], Path]:
    ids = run_in_harness(redis_client, 40)
    archive_all(redis_client, tmp_path / "archive")
    return ids, tmp_path / "archive"


def test_replay_reproduces_every_final_state_output_and_task_record_of_the_live_run(
    archived: tuple[list[str], Path], redis_client: redis.Redis
) -> None:
    ids, directory = archived
    report = audit_archive(directory, KEYS, client=redis_client)
    assert report.ok, report.first_problem
    assert sorted(w.workflow for w in report.workflows) == sorted(ids)
    assert {w.live for w in report.workflows} == {"equal"}
    assert {w.state.status for w in report.workflows if w.state} == {"finished"}


def test_the_run_had_retries_so_replay_checked_attempt_numbers(
    archived: tuple[list[str], Path], redis_client: redis.Redis
) -> None:
    _, directory = archived
    report = audit_archive(directory, KEYS)
    attempts = [
        row.get("attempt", 1)
        for w in report.workflows
        for row in w.summary()["timeline"]
        if row["event"] == "start-task"
    ]
    assert max(attempts) >= 2
    assert report.ok


def test_replay_works_from_the_archive_alone_after_redis_is_flushed(
    archived: tuple[list[str], Path], redis_client: redis.Redis
) -> None:
    _, directory = archived
    redis_client.flushdb()
    report = audit_archive(directory, KEYS, client=redis_client)
    assert report.ok, report.first_problem
    assert {w.live for w in report.workflows} == {"not in Redis"}


def _end_task_of(workflow: str):
    def predicate(record: dict) -> bool:
        event = record.get("event") or {}
        return event.get("kind") == "end-task" and event.get("workflow") == workflow

    return predicate


def test_altering_one_archived_event_is_reported_with_its_workflow_and_event(
    archived: tuple[list[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, directory = archived
    target: dict = {}

    def alter(lines: list[bytes]) -> list[bytes]:
        number = find_line(lines, _end_task_of("w7"))
        record = orjson.loads(lines[number])
        record["event"]["output"] = {"forged": True}
        target.update(record)
        lines[number] = orjson.dumps(record)
        return lines

    rewrite(directory, alter)
    code = main(["replay", str(directory), "--offline"])
    out, err = capsys.readouterr()
    assert code == 1
    assert f"record {target['seq']} ({KEYS.lifecycle} {target['id']}, end-task of workflow w7)" in (
        out
    )
    assert "was altered" in err
    report = audit_archive(directory, KEYS)
    (diverged,) = report.diverged  # the forged output also fails the semantic check
    assert diverged.workflow == "w7"


def test_dropping_one_archived_event_is_reported_with_its_workflow_and_event(
    archived: tuple[list[str], Path],
) -> None:
    _, directory = archived
    dropped: dict = {}

    def drop(lines: list[bytes]) -> list[bytes]:
        number = find_line(lines, _end_task_of("w11"))
        dropped.update(orjson.loads(lines.pop(number)))
        return lines

    rewrite(directory, drop)
    report = audit_archive(directory, KEYS)
    assert not report.ok
    assert report.chain[0].message.startswith(f"record {dropped['seq']} is missing")
    (diverged,) = report.diverged
    assert diverged.workflow == "w11"
    # The replayed workflow never saw the end, so the archived start-task that followed it
    # (or the archived end of the workflow) has no cause: that is the diverging event.
    assert diverged.divergence is not None
    assert "never" in diverged.divergence.message


def test_reordering_two_archived_events_is_reported_with_their_workflow_and_event(
    archived: tuple[list[str], Path],
) -> None:
    _, directory = archived
    moved: dict = {}

    def swap(lines: list[bytes]) -> list[bytes]:
        number = find_line(lines, _end_task_of("w3"))
        later = (
            number
            + 1
            + find_line(
                lines[number + 1 :], lambda r: "stream" in r and r["stream"] == KEYS.lifecycle
            )
        )
        moved.update(orjson.loads(lines[later]))
        lines[number], lines[later] = lines[later], lines[number]
        return lines

    rewrite(directory, swap)
    report = audit_archive(directory, KEYS)
    assert not report.ok
    first = report.chain[0]
    assert "out of order" in first.message
    assert first.event == moved["id"]
    assert any(
        f.workflow == "w3" and "duplicated or out of order" in f.message for f in report.chain
    )


def test_replay_exits_0_when_equal_and_2_with_one_line_on_a_missing_archive(
    archived: tuple[list[str], Path], capsys: pytest.CaptureFixture[str], redis_url: str
) -> None:
    _, directory = archived
    assert main(["replay", str(directory), "--redis-url", redis_url]) == 0
    out, _ = capsys.readouterr()
    assert "workflow w0: finished, replay equal, live equal" in out
    assert main(["replay", str(directory / "nope"), "--offline"]) == 2
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "no such archive directory" in err


def test_replay_of_one_workflow_prints_json_with_its_timeline_and_workers(
    archived: tuple[list[str], Path], capsys: pytest.CaptureFixture[str], redis_url: str
) -> None:
    _, directory = archived
    code = main(["replay", str(directory), "--workflow", "w5", "--json", "--redis-url", redis_url])
    data = orjson.loads(capsys.readouterr().out)
    assert code == 0
    (replay,) = data["replays"]
    assert replay["workflow"] == "w5" and replay["live"] == "equal"
    ends = [row for row in replay["timeline"] if row["event"] == "end-task"]
    assert ends and {row["worker"] for row in ends} == {"harness"}


def test_history_shows_the_same_timeline_from_live_data(
    archived: tuple[list[str], Path], capsys: pytest.CaptureFixture[str], redis_url: str
) -> None:
    _, directory = archived
    assert main(["history", "w5", "--json", "--redis-url", redis_url]) == 0
    live = orjson.loads(capsys.readouterr().out)
    (replayed,) = [w for w in audit_archive(directory, KEYS).workflows if w.workflow == "w5"]
    assert live["complete"] and live["state"] == "finished"
    assert live["timeline"] == replayed.summary()["timeline"]


def test_a_corrupt_middle_line_is_reported_and_replay_goes_on(
    archived: tuple[list[str], Path],
) -> None:
    ids, directory = archived
    (segment,) = [p for p in directory.iterdir() if p.suffix == ".jsonl"][:1] or [None]
    assert segment is not None
    lines = segment.read_bytes().split(b"\n")
    middle = len(lines) // 2
    lines[middle] = b"{this is not json"
    segment.write_bytes(b"\n".join(lines))
    report = audit_archive(directory, KEYS)
    assert not report.ok
    assert any(f"{segment.name}:{middle + 1}" in f.message for f in report.chain)
    assert report.replayed >= len(ids) - 1  # every workflow but the damaged one's is replayed


def test_an_output_archived_in_the_same_millisecond_as_its_input_counts_as_its_output() -> None:
    # Ids count per stream: the start-task a start-workflow caused can carry the same
    # millisecond and a smaller sequence (1000-0 on the task stream, 1000-1 on the
    # lifecycle stream).
    graph = compile_text("@flow one\nstep\n", "one.flow")
    digest = graph.content_hash()
    graphs = ArchiveGraphs()
    graphs.add(digest, graph.to_json())
    start = ev.start_workflow("w", digest, {"n": 1}, salt="s")

    def replayed(emitted: list[Any]) -> WorkflowReplay:
        item = WorkflowReplay("w", inputs=[(KEYS.lifecycle, "1000-1", start)], emitted=emitted)
        return replay_workflow(item, graphs, KEYS)

    ((stream, task),) = replayed([]).unarchived  # nothing archived: all of it is unarchived
    same_ms = replayed([(stream, "1000-0", task)])
    assert same_ms.divergence is None and same_ms.unarchived == []
    forged = replayed([(stream, "1000-0", {**task, "input": {"n": 2}})])
    assert forged.divergence is not None and "field 'input'" in str(forged.divergence)


def test_the_audit_finds_a_rejected_start_equal_to_redis_not_lost(
    harness: Harness, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A start the lifecycle refused never ran: Redis holding nothing of it agrees with
    the archive, and `recover` has nothing to bring back."""
    keys = KEYS
    graph = compile_text("A → B")
    harness.submit(graph, None, "ok")
    event = ev.start_workflow("refused", graph.content_hash(), None)
    event["claimed"] = "yes"
    redis_client.xadd(keys.lifecycle, {k: orjson.dumps(v) for k, v in event.items()})
    harness.pump(lambda call: call.input)
    archive_all(redis_client, tmp_path / "archive")
    report = audit_archive(tmp_path / "archive", keys, client=redis_client)
    shown = {w.workflow: (w.shown_state, w.live) for w in report.workflows}
    assert shown["refused"] == ("never started", "equal")
    assert report.summary()["lost_in_redis"] == 0
