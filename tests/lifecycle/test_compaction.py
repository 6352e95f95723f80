"""Compaction: a finished workflow's task records leave Redis after --keep-details.

What it was — state, output, input, times — stays until retention removes it;
the receipts archive keeps every start and end, and the audit still finds the
live record equal to the replay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall
from lifecycle import records as rec
from lifecycle.audit.report import audit_archive
from lifecycle.cli import main
from lifecycle.client import Client
from lifecycle.engine.advance import Advancer
from lifecycle.engine.retention import retention_pump
from lifecycle.inspect import describe_workflow
from lifecycle.keys import Keys
from tests.lifecycle.audit_helpers import archive_all
from tests.lifecycle.harness import Harness

KEYS = Keys()
CHAIN = compile_text(" → ".join(f"T{n}" for n in range(10)))


def ok(call: TaskCall) -> Any:
    return {"n": call.input.get("n", 0) + 1} if isinstance(call.input, dict) else {}


def broken(call: TaskCall) -> Any:
    raise RuntimeError("broke")


def compactor(client: redis.Redis) -> Any:
    return retention_pump(client, KEYS)


@pytest.fixture
def compacting(redis_client: redis.Redis) -> Harness:
    harness = Harness(redis_client, KEYS)
    harness.advancer = Advancer(redis_client, KEYS, retain_ms=3_600_000, keep_details_ms=0)
    return harness


def task_fields(client: redis.Redis, workflow_id: str) -> list[bytes]:
    names = client.hkeys(KEYS.workflow(workflow_id))
    return [n for n in names if n.startswith((b"n:", b"o:"))]  # type: ignore[union-attr]


def test_a_finished_workflow_keeps_what_it_was_and_loses_its_task_records(
    compacting: Harness, tmp_path: Path
) -> None:
    workflow_id = compacting.submit(CHAIN, {"n": 0}, "wf")
    compacting.pump(ok)
    assert len(task_fields(compacting.client, workflow_id)) == 20
    before = compacting.client.memory_usage(KEYS.workflow(workflow_id))
    assert compactor(compacting.client).fire_due() == 1
    assert task_fields(compacting.client, workflow_id) == []
    after = len(compacting.client.hget(KEYS.compacted, workflow_id) or b"")
    assert after < before / 10 and after < 100, (before, after)
    status = Client(compacting.client, KEYS).status(workflow_id)
    assert status.state == "finished"
    described = describe_workflow(compacting.client, KEYS, workflow_id)
    assert described["output"] == {"n": 10} and described["input"] == {"n": 0}
    assert described["tasks"] == [] and described["compacted"] is not None
    # The archive has every task; the audit finds the compacted record as replayed.
    archive = tmp_path / "archive"
    archive_all(compacting.client, archive)
    report = audit_archive(archive, KEYS, client=compacting.client)
    assert report.ok, report.first_problem
    assert report.workflows[0].live == "equal"


def test_inspect_says_where_the_task_records_of_a_compacted_workflow_are(
    compacting: Harness, redis_url: str, capsys: Any
) -> None:
    compacting.submit(CHAIN, {"n": 0}, "wf")
    compacting.pump(ok)
    compactor(compacting.client).fire_due()
    assert main(["inspect", "wf", "--redis-url", redis_url]) == 0
    out = capsys.readouterr().out
    assert "task records compacted" in out and "lifecycle history wf" in out
    assert "not started" not in out


def test_failed_and_running_workflows_are_not_compacted(compacting: Harness) -> None:
    failed = compacting.submit(compile_text("A → B"), {}, "failed")
    compacting.pump(broken)
    running = compacting.submit(compile_text("A → B"), {}, "running")
    compacting.advance()
    assert compacting.client.zscore(KEYS.expiring, running) is None
    # The failed one is due for removal only (in an hour): nothing is due now.
    ended = int(compacting.client.hget(KEYS.workflow(failed), rec.ENDED) or 0)
    assert compacting.client.zscore(KEYS.expiring, failed) == ended + 3_600_000
    assert compactor(compacting.client).fire_due() == 0
    assert task_fields(compacting.client, failed)  # a restart runs from them


def test_details_are_kept_for_the_time_asked_then_the_removal_is_scheduled(
    redis_client: redis.Redis,
) -> None:
    harness = Harness(redis_client, KEYS)
    harness.advancer = Advancer(redis_client, KEYS, retain_ms=3_600_000, keep_details_ms=600_000)
    harness.submit(CHAIN, {"n": 0}, "wf")
    harness.pump(ok)
    ended = int(redis_client.hget(KEYS.workflow("wf"), rec.ENDED) or 0)
    assert redis_client.zscore(KEYS.expiring, "wf") == ended + 600_000
    assert compactor(redis_client).fire_due() == 0
    assert compactor(redis_client).fire_due(ended + 600_000) == 1
    assert task_fields(redis_client, "wf") == []
    assert not redis_client.exists(KEYS.workflow("wf"))  # one string now
    assert redis_client.zscore(KEYS.expiring, "wf") is None  # its removal is listed
    [listed] = redis_client.lrange(KEYS.expiring_compacted, 0, -1)
    assert listed.startswith(b"wf ")
    assert redis_client.get(KEYS.expiring_compacted_last) == b"%d" % (ended + 3_600_000)
    assert compactor(redis_client).fire_due(ended + 3_600_000 - 1) == 0
    assert compactor(redis_client).fire_due(ended + 3_600_000) == 1
    assert not redis_client.exists(KEYS.compacted, KEYS.expiring_compacted)
    assert redis_client.zcard(KEYS.workflows) == 0


def test_kept_forever_a_finished_workflow_is_compacted_and_leaves_the_schedule(
    redis_client: redis.Redis,
) -> None:
    harness = Harness(redis_client, KEYS)
    harness.advancer = Advancer(redis_client, KEYS, retain_ms=0, keep_details_ms=0)
    harness.submit(CHAIN, {"n": 0}, "wf")
    harness.pump(ok)
    assert compactor(redis_client).fire_due() == 1
    assert task_fields(redis_client, "wf") == []
    assert redis_client.zcard(KEYS.expiring) == 0 and redis_client.hexists(KEYS.compacted, "wf")
    assert not redis_client.exists(KEYS.expiring_compacted)
