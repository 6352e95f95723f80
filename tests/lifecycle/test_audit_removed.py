"""Replay and recover tell a workflow deleted or removed by retention from one Redis lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall
from lifecycle.audit.recover import recover
from lifecycle.audit.replay import DELETED, NOT_IN_REDIS, REMOVED
from lifecycle.audit.report import audit_archive
from lifecycle.client import Client
from lifecycle.keys import Keys
from tests.lifecycle.audit_helpers import archive_all
from tests.lifecycle.harness import Harness

KEYS = Keys()


def ok(call: TaskCall) -> Any:
    return {"n": call.name}


def finished(harness: Harness, *ids: str) -> None:
    for workflow_id in ids:
        harness.submit(compile_text("A → B"), {"id": workflow_id}, workflow_id)
    harness.pump(ok)


def by_id(directory: Path, client: redis.Redis) -> dict[str, Any]:
    report = audit_archive(directory, KEYS, client=client)
    assert report.ok, report.first_problem
    return {w.workflow: w for w in report.workflows}


def test_a_deleted_workflow_is_deleted_in_replay_not_lost(harness: Harness, tmp_path: Path) -> None:
    finished(harness, "gone", "kept")
    Client(harness.client, KEYS).delete("gone")
    harness.advance()
    archive_all(harness.client, tmp_path / "a")
    found = by_id(tmp_path / "a", harness.client)
    assert (found["gone"].live, found["gone"].shown_state) == (DELETED, "deleted")
    assert found["kept"].live == "equal"
    report = recover(harness.client, tmp_path / "a", KEYS)
    assert report.restored == [] and not harness.client.exists(KEYS.workflow("gone"))


def test_an_ended_workflow_past_its_retention_is_removed_not_lost(
    harness: Harness, tmp_path: Path
) -> None:
    finished(harness, "old")
    archive_all(harness.client, tmp_path / "a")
    harness.client.set(KEYS.retention, 1)  # 1 ms: long past
    harness.client.delete(KEYS.workflow("old"))
    assert by_id(tmp_path / "a", harness.client)["old"].live == REMOVED
    assert recover(harness.client, tmp_path / "a", KEYS).restored == []


def test_an_ended_workflow_redis_lost_before_its_retention_is_restored_and_scheduled(
    harness: Harness, tmp_path: Path
) -> None:
    finished(harness, "young")
    archive_all(harness.client, tmp_path / "a")
    ended = int(harness.client.hget(KEYS.workflow("young"), "ended"))
    harness.client.set(KEYS.retention, 3_600_000)
    harness.client.delete(KEYS.workflow("young"))
    assert by_id(tmp_path / "a", harness.client)["young"].live == NOT_IN_REDIS
    assert recover(harness.client, tmp_path / "a", KEYS).restored == ["young"]
    assert Client(harness.client, KEYS).status("young").state == "finished"
    # replay's clock is the archived events' times: the end within a moment of live's
    assert abs(harness.client.zscore(KEYS.expiring, "young") - (ended + 3_600_000)) < 1_000
