"""Scenario 1: each worker kind SIGKILLed mid-run and restarted.

A killed lifecycle or task worker leaves its events pending; a peer (or its
restart) claims them after ``claim_idle`` and applies them once. A killed
receipts worker picks up from its archive's last id: the archive stays complete,
without duplicates, and its hash chain intact.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lifecycle.audit.report import audit_archive
from tests.reliability.helpers import (
    KEYS,
    Engine,
    check_exactly_once,
    record,
    size,
    submit,
    wait_all_ended,
)

WORKFLOWS = size(6000, 30_000)


def held(engine: Engine, stream: str | None, group: str) -> int:
    """Entries the consumer "victim" holds unacknowledged right now."""
    if stream is None:
        return 0
    consumers = engine.client.xinfo_consumers(stream, group)
    return sum(c["pending"] for c in consumers if c["name"] == b"victim")


def run_with_kills(
    engine: Engine,
    start_victim: Callable[[], object],
    kind: str,
    stream: str | None = None,
    group: str = "",
) -> dict:
    ids, expected = submit(engine.client, WORKFLOWS)
    began = time.monotonic()
    victim = [start_victim()]
    kills = [0]
    next_kill = [began + 0.6]
    in_hand = [0]

    def kill_and_restart() -> None:
        if kills[0] >= 3 or time.monotonic() < next_kill[0]:
            return
        in_hand[0] += held(engine, stream, group)
        victim[0].kill()  # SIGKILL: no cleanup, whatever it holds stays pending
        victim[0].wait()
        kills[0] += 1
        victim[0] = start_victim()
        next_kill[0] = time.monotonic() + 0.5  # time to start and take work

    found = wait_all_ended(engine.client, ids, timeout=size(60, 600), during=kill_and_restart)
    elapsed = time.monotonic() - began
    assert kills[0] >= 2, f"the run ended after {elapsed:.1f} s, before the worker was killed twice"
    counts = check_exactly_once(engine.client, found, expected)
    return {
        "kind": kind,
        "kills": kills[0],
        "held_at_kills": in_hand[0],
        "seconds": round(elapsed, 1),
        **counts,
    }


def test_a_lifecycle_worker_killed_three_times_loses_and_repeats_nothing(
    engine_factory: Callable[..., Engine],
) -> None:
    engine = engine_factory()
    steady = engine.lifecycle("steady")
    engine.noop("noop-0")
    figures = run_with_kills(
        engine,
        lambda: engine.lifecycle("victim"),
        "lifecycle",
        KEYS.lifecycle,
        KEYS.lifecycle_group,
    )
    assert steady.poll() is None
    record("kill-lifecycle", **figures)


@pytest.mark.parametrize("pack_starts", [False, True], ids=["start-task", "packed-starts"])
def test_a_task_worker_killed_three_times_loses_and_repeats_no_advance(
    engine_factory: Callable[..., Engine], pack_starts: bool
) -> None:
    engine = engine_factory(pack_starts=pack_starts)
    engine.lifecycle("lifecycle-0")
    steady = engine.noop("steady")
    figures = run_with_kills(
        engine, lambda: engine.noop("victim"), "noop", KEYS.tasks("default"), "workers"
    )
    assert steady.poll() is None
    record("kill-task-worker" + ("-packed-starts" if pack_starts else ""), **figures)


def test_a_receipts_worker_killed_three_times_leaves_a_complete_chained_archive(
    engine_factory: Callable[..., Engine], tmp_path: Path
) -> None:
    engine = engine_factory()
    archive = tmp_path / "archive"
    engine.lifecycle("lifecycle-0")
    engine.noop("noop-0")
    # --no-trim: the streams keep every entry, to compare the archive with them.
    figures = run_with_kills(
        engine, lambda: engine.receipts(archive, "--no-trim", "--batch-size", "200"), "receipts"
    )
    deadline = time.monotonic() + 60
    report = audit_archive(archive, KEYS, client=engine.client)
    while not (report.ok and len(report.workflows) == WORKFLOWS):
        if time.monotonic() > deadline:
            pytest.fail(f"archive incomplete: {report.first_problem}, {len(report.workflows)}")
        time.sleep(0.5)
        report = audit_archive(archive, KEYS, client=engine.client)
    assert {w.live for w in report.workflows} == {"equal"}
    archived = archived_entries(archive)
    for stream in (KEYS.lifecycle, KEYS.tasks("default")):
        added = engine.client.xinfo_stream(stream)["entries-added"]
        ids = archived.get(stream, [])
        assert len(ids) == len(set(ids)) == added, f"{stream}: {len(ids)} archived of {added}"
    record("kill-receipts", **figures, archived=sum(len(v) for v in archived.values()))


def archived_entries(directory: Path) -> dict[str, list[str]]:
    from lifecycle.audit.archive import read_archive

    found: dict[str, list[str]] = {}
    for _, item in read_archive(directory):
        if "stream" in item:
            found.setdefault(item["stream"], []).append(item["id"])
    return found
