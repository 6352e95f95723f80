"""Packed answers in the archive and the streams: replay and history see each answer of an
end-tasks entry as the end-task it stands for."""

from __future__ import annotations

from pathlib import Path

import redis

from flowlang.compiler import compile_text
from lifecycle.audit.report import audit_archive
from lifecycle.history import live_history
from lifecycle.keys import Keys
from tests.lifecycle.audit_helpers import archive_all
from tests.lifecycle.harness import Harness
from workers.noop import NoopWorker

KEYS = Keys()
FLOWS = ["A → B → C", "A → { B C } → D", "A → * B → C"]


def _run_packed(client: redis.Redis, count: int) -> list[str]:
    harness = Harness(client)
    worker = NoopWorker(
        ["default"], pool=client.connection_pool, handle_signals=False, block_ms=20,
        pack_answers=True,
    )  # fmt: skip
    ids = []
    for n in range(count):
        flow = FLOWS[n % len(FLOWS)]
        value = [n, n + 1] if "*" in flow else {"n": n}
        ids.append(harness.submit(compile_text(flow), value, f"p{n}"))
    for _ in range(60):
        if not harness.advance() + worker.listen(idle_timeout=0.05):
            break
    else:
        raise AssertionError("still busy")
    return ids


def test_replay_of_an_archive_with_packed_answers_agrees_with_live(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    ids = _run_packed(redis_client, 12)
    archive_all(redis_client, tmp_path)
    report = audit_archive(tmp_path, KEYS, client=redis_client)
    assert report.ok, report.first_problem
    assert sorted(w.workflow for w in report.workflows) == sorted(ids)
    assert {w.live for w in report.workflows} == {"equal"}
    assert {w.state.status for w in report.workflows if w.state} == {"finished"}
    packed_inputs = [
        entry for w in report.workflows for entry in w.inputs if entry[2].get("packed")
    ]
    assert len(packed_inputs) >= 12 * 3  # every task's answer came packed


def test_history_shows_each_packed_answer_live_and_from_the_archive(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    _run_packed(redis_client, 3)
    live = live_history(redis_client, KEYS, "p1")  # A → { B C } → D
    ends = [row for row in live["timeline"] if row["event"] == "end-task"]
    assert len(ends) == 4 and {row["status"] for row in ends} == {"SUCCESS"}
    archive_all(redis_client, tmp_path)
    # Trimmed once archived: the timeline comes back from the archive.
    for stream in (KEYS.lifecycle, KEYS.tasks("default")):
        redis_client.xtrim(stream, maxlen=0)
    again = live_history(redis_client, KEYS, "p1", archive=tmp_path)
    assert [r for r in again["timeline"] if r["event"] == "end-task"] == [
        {**row, "archived": True} for row in ends
    ]
