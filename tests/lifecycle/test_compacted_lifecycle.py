"""The lifecycle worker knows a compacted workflow (no hash, an entry of
{flow}:compacted) as the finished workflow it is: a second start of its id is a
duplicate, a late answer too, a control is refused as for any finished workflow, and
a delete removes it in the lifecycle's own commit, whichever form it has when the
delete is applied. Its listed removal never holds back the ones behind it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.audit.report import audit_archive
from lifecycle.client import Client
from lifecycle.engine.retention import retention_pump
from lifecycle.errors import UnknownWorkflow
from lifecycle.events import end_task
from lifecycle.inspect import describe_workflow
from lifecycle.submit import start_workflow
from tests.lifecycle.audit_helpers import archive_all
from tests.lifecycle.harness import ScriptOnly, decode
from tests.lifecycle.test_compact_record import (
    CHAIN,
    HOUR,
    KEYS,
    compacting,
    ok,
    run_and_compact,
)


@pytest.fixture(params=["watched", "script"])
def path(request: pytest.FixtureRequest) -> str:
    """Both commit paths: the batch's MULTI/EXEC, and advance.lua after a lost race."""
    return str(request.param)


def harness_for(client: redis.Redis, path: str, retain_ms: int = HOUR) -> Any:
    harness = compacting(client, retain_ms)
    if path == "script":
        harness.advancer = ScriptOnly(client, KEYS, retain_ms=retain_ms, keep_details_ms=0)
    return harness


def advance(harness: Any) -> tuple[list[str], list[tuple[str, str]], int]:
    """One batch of the lifecycle stream: (duplicates, rejected, committed)."""
    reply = harness.client.xreadgroup(KEYS.lifecycle_group, "x", {KEYS.lifecycle: ">"}, count=500)
    entries = [(i.decode(), decode(f)) for _, items in reply or [] for i, f in items]
    result = harness.advancer.apply(entries)
    done = result.duplicates + [e for e, _ in result.rejected]
    if done:
        harness.client.xack(KEYS.lifecycle, KEYS.lifecycle_group, *done)
    return list(result.duplicates), list(result.rejected), result.committed


def before_and_after_compaction(harness: Any, event: dict[str, Any]) -> tuple[Any, Any]:
    """What a batch of ``event`` gives for the finished workflow "wf" as a hash, then
    again once retention compacted it (``advance``'s triple each)."""
    flat = {name: orjson.dumps(value) for name, value in event.items()}
    harness.client.xadd(KEYS.lifecycle, flat)
    as_hash = advance(harness)
    ended = int(harness.client.hget(KEYS.workflow("wf"), rec.ENDED) or 0)
    assert retention_pump(harness.client, KEYS).fire_due(ended) == 1
    harness.client.xadd(KEYS.lifecycle, flat)
    return as_hash, advance(harness)


def gone(client: redis.Redis, workflow_id: str) -> bool:
    return not (
        client.exists(KEYS.workflow(workflow_id))
        or client.hexists(KEYS.compacted, workflow_id)
        or client.zscore(KEYS.workflows, workflow_id) is not None
        or client.zscore(KEYS.expiring, workflow_id) is not None
        or client.hexists(KEYS.stopped, workflow_id)
    )


def test_a_second_start_of_a_compacted_id_is_a_duplicate(
    redis_client: redis.Redis, path: str
) -> None:
    harness = harness_for(redis_client, path)
    run_and_compact(harness, "wf")
    finished = redis_client.hget(KEYS.outcomes, rec.FINISHED)
    start_workflow(redis_client, CHAIN, {"n": 100}, "wf", KEYS)
    duplicates, rejected, committed = advance(harness)
    assert (len(duplicates), rejected, committed) == (1, [], 0)
    assert not redis_client.exists(KEYS.workflow("wf"))
    assert describe_workflow(redis_client, KEYS, "wf")["output"]["n"] == 5
    assert redis_client.hget(KEYS.outcomes, rec.FINISHED) == finished
    assert redis_client.xpending(KEYS.lifecycle, KEYS.lifecycle_group)["pending"] == 0


def test_a_start_of_a_compacted_id_among_new_ones_is_the_only_duplicate(
    redis_client: redis.Redis,
) -> None:
    harness = compacting(redis_client)
    run_and_compact(harness, "wf")
    for workflow_id in ("a", "wf", "b"):
        start_workflow(redis_client, CHAIN, {"n": 100}, workflow_id, KEYS)
    duplicates, rejected, committed = advance(harness)
    assert (len(duplicates), rejected, committed) == (1, [], 2)
    assert redis_client.exists(KEYS.workflow("a"), KEYS.workflow("b")) == 2
    assert not redis_client.exists(KEYS.workflow("wf"))


def test_a_late_answer_for_a_compacted_workflow_is_a_duplicate_as_before_compaction(
    redis_client: redis.Redis, path: str
) -> None:
    harness = harness_for(redis_client, path)
    harness.submit(CHAIN, {"n": 0}, "wf")
    harness.advance()
    started: Any = redis_client.xrange(KEYS.tasks("default"))
    [(_, fields)] = started
    harness.pump(ok)
    answer = end_task(decode(fields), {"n": 1}, worker="late")  # T0's, answered again
    before, after = before_and_after_compaction(harness, answer)
    assert (len(before[0]), before[1:]) == (len(after[0]), after[1:]) == (1, ([], 0))


@pytest.mark.parametrize(
    "kind", [ev.TERMINATE_WORKFLOW, ev.PAUSE_WORKFLOW, ev.RESUME_WORKFLOW, ev.RESTART_WORKFLOW]
)
def test_a_control_for_a_compacted_workflow_is_refused_as_for_a_finished_one(
    redis_client: redis.Redis, kind: str
) -> None:
    harness = compacting(redis_client)
    harness.submit(CHAIN, {"n": 0}, "wf")
    harness.pump(ok)
    as_hash, compacted = before_and_after_compaction(harness, ev.control(kind, "wf", "why"))
    reasons = [[reason.partition(": ")[2] for _, reason in r[1]] for r in (as_hash, compacted)]
    assert reasons[0] == reasons[1] == [f"{kind} of wf: " + ev.refusal(kind, "finished")]  # type: ignore[operator]
    assert (as_hash[0], as_hash[2]) == (compacted[0], compacted[2]) == ([], 0)
    assert redis_client.hexists(KEYS.compacted, "wf")


def test_a_delete_of_a_compacted_workflow_removes_it_in_the_lifecycles_commit(
    redis_client: redis.Redis, path: str
) -> None:
    harness = harness_for(redis_client, path)
    run_and_compact(harness, "wf")
    run_and_compact(harness, "kept")
    Client(redis_client, KEYS).delete("wf")
    # The client sends the event alone: nothing is written back before the lifecycle runs.
    assert not redis_client.exists(KEYS.workflow("wf"))
    assert redis_client.hexists(KEYS.compacted, "wf")
    duplicates, rejected, committed = advance(harness)
    assert (duplicates, rejected, committed) == ([], [], 1)
    assert gone(redis_client, "wf")
    with pytest.raises(UnknownWorkflow):
        Client(redis_client, KEYS).status("wf")
    assert redis_client.hkeys(KEYS.compacted) == [b"kept"]


def test_a_delete_sent_before_compaction_and_applied_after_it_deletes_the_workflow(
    redis_client: redis.Redis, path: str
) -> None:
    harness = harness_for(redis_client, path)
    harness.submit(CHAIN, {"n": 0}, "wf")
    harness.pump(ok)
    ended = int(redis_client.hget(KEYS.workflow("wf"), rec.ENDED) or 0)
    Client(redis_client, KEYS).delete("wf")  # still a hash when sent
    assert retention_pump(redis_client, KEYS).fire_due(ended) == 1  # compacted meanwhile
    assert advance(harness) == ([], [], 1)
    assert gone(redis_client, "wf")


def test_a_deleted_compacted_id_starts_afresh_and_stays_deleted_once_deleted_again(
    redis_client: redis.Redis, path: str
) -> None:
    harness = harness_for(redis_client, path)
    ended = run_and_compact(harness, "wf")
    Client(redis_client, KEYS).delete("wf")
    harness.advance()
    start_workflow(redis_client, CHAIN, {"n": 100}, "wf", KEYS)
    harness.pump(ok)  # runs anew: the id was free
    assert describe_workflow(redis_client, KEYS, "wf")["output"]["n"] == 105
    assert not redis_client.hexists(KEYS.compacted, "wf")
    Client(redis_client, KEYS).delete("wf")
    harness.advance()
    assert gone(redis_client, "wf")
    for at in (ended + HOUR, ended + 100 * HOUR):  # nothing comes back
        retention_pump(redis_client, KEYS).fire_due(at)
        assert gone(redis_client, "wf")
        with pytest.raises(UnknownWorkflow):
            Client(redis_client, KEYS).status("wf")


def test_a_delete_then_a_start_of_a_compacted_id_in_one_batch_run_it_anew(
    redis_client: redis.Redis, path: str
) -> None:
    harness = harness_for(redis_client, path)
    run_and_compact(harness, "wf")
    Client(redis_client, KEYS).delete("wf")
    start_workflow(redis_client, CHAIN, {"n": 100}, "wf", KEYS)
    assert advance(harness) == ([], [], 1)
    assert not redis_client.hexists(KEYS.compacted, "wf")
    harness.pump(ok)
    assert describe_workflow(redis_client, KEYS, "wf")["output"]["n"] == 105


def test_a_new_run_of_a_deleted_compacted_id_has_its_graph_loaded_with_the_batch(
    redis_client: redis.Redis,
) -> None:
    # The transition reads no Redis: every graph a batch needs is loaded before it, the
    # new run's too, though its id's record said nothing of that graph.
    from flowlang.compiler import compile_text

    harness = compacting(redis_client)
    run_and_compact(harness, "wf")
    Client(redis_client, KEYS).delete("wf")
    start_workflow(redis_client, compile_text("@flow other\nU0 → U1"), None, "wf", KEYS)
    (_, fields), *_ = redis_client.xrevrange(KEYS.lifecycle, count=1)
    wanted = decode(fields)["graph"]
    loaded: list[str] = []
    load = harness.advancer.graphs.load
    harness.advancer.graphs.load = lambda digests: (loaded.extend(digests), load(digests))
    assert advance(harness) == ([], [], 1)
    assert wanted in loaded


def test_the_audit_replays_a_duplicate_start_and_a_delete_of_compacted_workflows(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    harness = compacting(redis_client)
    for workflow_id in ("dup", "del", "kept"):
        run_and_compact(harness, workflow_id)
    start_workflow(redis_client, CHAIN, {"n": 100}, "dup", KEYS)
    Client(redis_client, KEYS).delete("del")
    harness.pump(ok)
    assert gone(redis_client, "del")
    archive = tmp_path / "archive"
    archive_all(redis_client, archive)
    report = audit_archive(archive, KEYS, client=redis_client)
    assert report.ok, report.first_problem
    replayed = {w.workflow: (w.shown_state, w.live) for w in report.workflows}
    assert replayed["dup"] == replayed["kept"] == ("finished", "equal")
    assert replayed["del"][0] == "deleted"


def test_a_listed_removal_of_a_deleted_id_never_holds_back_the_ones_behind_it(
    redis_client: redis.Redis,
) -> None:
    # "wf" compacted, deleted (its list entry stays), then compacted again due later,
    # at a time that shares the old entry's compaction time modulo 36^3 ms: an entry
    # that named only that would take the new record for its own, due later than the
    # entries behind it.
    harness = compacting(redis_client)
    pump = retention_pump(redis_client, KEYS)
    head = run_and_compact(harness, "a") + HOUR  # holds the head: "wf"'s entry stays
    time.sleep(0.005)
    first = run_and_compact(harness, "wf")
    Client(redis_client, KEYS).delete("wf")
    harness.advance()
    time.sleep(0.005)
    behind = run_and_compact(harness, "b") + HOUR
    harness.advancer = compacting(redis_client, 2 * HOUR).advancer
    harness.submit(CHAIN, {"n": 0}, "wf")
    harness.pump(ok)
    again = int(redis_client.hget(KEYS.workflow("wf"), rec.ENDED) or 0)
    assert pump.fire_due(first + 46656 * (1 + (again - first) // 46656)) == 1
    assert [e.split()[0] for e in redis_client.lrange(KEYS.expiring_compacted, 0, -1)] == [
        b"a",
        b"wf",
        b"b",
        b"wf",
    ]
    assert pump.fire_due(head) >= 1
    assert pump.fire_due(behind) >= 1
    assert not redis_client.hexists(KEYS.compacted, "b")
    assert redis_client.hexists(KEYS.compacted, "wf")


def test_a_deleted_workflows_later_removal_no_longer_keeps_the_next_ones_off_the_list(
    redis_client: redis.Redis,
) -> None:
    # Removals are listed only in due order: one due before the last listed goes to
    # {flow}:expiring. Once the list empties, what was listed last no longer counts.
    harness = compacting(redis_client, 2 * HOUR)
    pump = retention_pump(redis_client, KEYS)
    run_and_compact(harness, "long")
    Client(redis_client, KEYS).delete("long")
    harness.advance()
    pump.fire_due()  # drops its entry: the list is empty
    assert not redis_client.exists(KEYS.expiring_compacted, KEYS.expiring_compacted_last)
    harness.advancer = compacting(redis_client, HOUR).advancer
    short = run_and_compact(harness, "short") + HOUR
    assert redis_client.zscore(KEYS.expiring, "short") is None  # listed, not scheduled
    listed = redis_client.lrange(KEYS.expiring_compacted, 0, -1)
    assert [entry.split()[0] for entry in listed] == [b"short"]
    assert pump.fire_due(short) == 1
    assert gone(redis_client, "short")


@pytest.mark.parametrize("compacted", [True, False])
@pytest.mark.parametrize("one_batch", [True, False])
def test_an_id_deleted_and_started_again_replays_equal(
    redis_client: redis.Redis, tmp_path: Path, compacted: bool, one_batch: bool
) -> None:
    # Both runs send start-tasks of the same ids, each run with tokens of its own salt:
    # the audit matches each run's to its own.
    harness = compacting(redis_client)
    if compacted:
        run_and_compact(harness, "wf")
    else:
        harness.submit(CHAIN, {"n": 0}, "wf")
        harness.pump(ok)
    Client(redis_client, KEYS).delete("wf")
    if not one_batch:
        harness.advance()
    start_workflow(redis_client, CHAIN, {"n": 100}, "wf", KEYS)
    harness.pump(ok)
    assert describe_workflow(redis_client, KEYS, "wf")["output"]["n"] == 105
    archive_all(redis_client, tmp_path / "archive")
    report = audit_archive(tmp_path / "archive", KEYS, client=redis_client)
    assert report.ok, report.first_problem
    assert {w.workflow: w.live for w in report.workflows} == {"wf": "equal"}
