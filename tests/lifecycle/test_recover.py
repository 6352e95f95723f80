"""Recover: workflows Redis lost (or holds at an older point) come back from the archive
and finish, each task advancing its workflow once."""

from __future__ import annotations

from pathlib import Path

import redis

from flowlang.compiler import compile_text
from flowlang.runner import run
from lifecycle.audit.recover import recover
from lifecycle.audit.replay import BEHIND, NOT_IN_REDIS
from lifecycle.audit.report import audit_archive
from lifecycle.engine.store import load_workflow
from lifecycle.keys import TASK_GROUP
from tests.lifecycle.audit_helpers import KEYS, archive_all
from tests.lifecycle.harness import Harness

FLOW = compile_text("A → B → C (- $timeout: 3600 -)")


def echo(call):
    return {"by": call.name, "in": call.input}


def _halfway(redis_client: redis.Redis, count: int) -> tuple[Harness, list[str], dict]:
    """``count`` workflows with A done and B running; the records as they were with A
    still running (what Redis would hold after losing the latest writes)."""
    harness = Harness(redis_client, KEYS)
    ids = [harness.submit(FLOW, {"n": n}, f"w{n}") for n in range(count)]
    harness.advance()
    older = {w: redis_client.dump(KEYS.workflow(w)) for w in ids}
    harness.work(echo)
    harness.advance()
    return harness, ids, older


def test_workflows_lost_or_behind_in_redis_are_restored_and_finish_once(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    harness, ids, older = _halfway(redis_client, 6)
    archive_all(redis_client, tmp_path / "archive")
    gone, behind = ids[:3], ids[3:]
    for workflow in gone:
        redis_client.delete(KEYS.workflow(workflow))
    for workflow in behind:
        redis_client.restore(KEYS.workflow(workflow), 0, older[workflow], replace=True)

    before = audit_archive(tmp_path / "archive", KEYS, client=redis_client)
    assert before.ok, before.first_problem
    assert {w.workflow: w.live for w in before.lost} == {
        **{w: NOT_IN_REDIS for w in gone},
        **{w: BEHIND for w in behind},
    }

    report = recover(redis_client, tmp_path / "archive", KEYS)
    assert sorted(report.restored) == sorted(ids) and report.skipped == []
    assert report.resent == 6  # B of each, with its original token
    for workflow in ids:
        assert load_workflow(redis_client, KEYS, workflow).state.running == {"2": 1}

    harness.pump(echo)
    expected = run(FLOW, echo, None)
    for n, workflow in enumerate(ids):
        record = load_workflow(redis_client, KEYS, workflow)
        assert record.status == "finished", workflow
        assert record.output == run(FLOW, echo, {"n": n}).output
    assert expected.status == "finished"
    starts = [f for _, f in redis_client.xrange(KEYS.tasks("default"))]
    c_starts = [f for f in starts if f[b"name"] == b'"C"']
    assert len(c_starts) == len(ids)  # B answered twice (original + resent), C started once

    archive_all(redis_client, tmp_path / "archive")
    after = audit_archive(tmp_path / "archive", KEYS, client=redis_client)
    assert after.ok, after.first_problem
    assert set(after.live) == {"equal"}


def test_recover_restores_pending_timers_of_a_lost_workflow(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    harness = Harness(redis_client, KEYS)
    workflow = harness.submit(compile_text("A (- $timeout: 3600 -)"), {}, "timed")
    harness.advance()
    ((member, due),) = redis_client.zrange(KEYS.timers, 0, -1, withscores=True)
    archive_all(redis_client, tmp_path / "archive")
    redis_client.delete(KEYS.workflow(workflow), KEYS.timers)
    report = recover(redis_client, tmp_path / "archive", KEYS)
    assert report.restored == [workflow]
    ((restored, restored_due),) = redis_client.zrange(KEYS.timers, 0, -1, withscores=True)
    # Due as the replay computes it: from the archived event's time, not the commit's.
    assert restored == member and abs(restored_due - due) < 1000


def test_a_dry_run_changes_nothing(redis_client: redis.Redis, tmp_path: Path) -> None:
    _, ids, _ = _halfway(redis_client, 2)
    archive_all(redis_client, tmp_path / "archive")
    redis_client.delete(KEYS.workflow(ids[0]))
    report = recover(redis_client, tmp_path / "archive", KEYS, dry_run=True)
    assert report.restored == [ids[0]]
    assert not redis_client.exists(KEYS.workflow(ids[0]))


def test_the_recover_command_restores_and_says_what_it_did(
    redis_client: redis.Redis, tmp_path: Path, redis_url: str, capsys
) -> None:
    from lifecycle.cli import main

    _, ids, _ = _halfway(redis_client, 2)
    archive_all(redis_client, tmp_path / "archive")
    redis_client.delete(KEYS.workflow(ids[1]))
    code = main(["recover", "--archive", str(tmp_path / "archive"), "--redis-url", redis_url])
    out = capsys.readouterr().out
    assert code == 0
    assert f"restored {ids[1]}" in out and "1 restored, 1 start-tasks sent again" in out
    assert load_workflow(redis_client, KEYS, ids[1]).state.running == {"2": 1}


def test_a_submission_the_archive_holds_but_redis_lost_before_its_start_is_recovered(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    harness = Harness(redis_client, KEYS)
    workflow = harness.submit(FLOW, {"n": 7}, "in-flight")
    archive_all(redis_client, tmp_path / "archive")  # the start-workflow, nothing after it
    harness.advance()
    redis_client.delete(KEYS.workflow(workflow), KEYS.tasks("default"))  # Redis lost it all
    report = audit_archive(tmp_path / "archive", KEYS, client=redis_client)
    assert report.ok, report.first_problem  # an archive that stops early is no divergence
    restored = recover(redis_client, tmp_path / "archive", KEYS)
    assert restored.restored == [workflow] and restored.resent == 1
    harness._group(KEYS.tasks("default"), TASK_GROUP)  # the stream went with Redis
    harness.pump(echo)
    assert load_workflow(redis_client, KEYS, workflow).output == run(FLOW, echo, {"n": 7}).output
