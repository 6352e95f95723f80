"""Scenarios 2 and 3: Redis itself SIGKILLed mid-run, restarted on the same files.

With ``appendfsync always`` every acknowledged write survives: the workers back off
while Redis is away, reconnect by themselves, and everything finishes exactly once.
With ``everysec`` and the AOF's tail cut (a host crash before the last fsync),
Redis comes back at an earlier point in time: the receipts archive is then the only
copy of what was lost, and ``python -m lifecycle recover`` restores from it the
workflows Redis holds behind the archive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests.reliability.helpers import (
    KEYS,
    Engine,
    check_exactly_once,
    decoded,
    record,
    size,
    start_tasks,
    states,
    submit,
    task_progress,
    wait_all_ended,
    wait_progress,
)

WORKFLOWS = size(2000, 20_000)
LOST_SECONDS = 1.0  # appendfsync everysec may lose up to this much
# A rewrite would rename the file being cut (and is no part of the crash).
NO_REWRITE = ["--aof-load-truncated", "yes", "--auto-aof-rewrite-percentage", "0"]


def workers(engine: Engine) -> list[subprocess.Popen[bytes]]:
    return [engine.lifecycle("lifecycle-0"), engine.noop("noop-0"), engine.noop("noop-1")]


def aof_tail(directory: Path) -> Path:
    """The incremental AOF file Redis appends to (multi-part AOF, Redis 7 / Valkey)."""
    (tail,) = sorted((directory / "appendonlydir").glob("*.incr.aof"))
    return tail


def ended_count(engine: Engine) -> int:
    outcomes = engine.client.hgetall(KEYS.outcomes)
    return sum(int(v) for v in outcomes.values())


def test_redis_killed_with_aof_always_comes_back_and_the_workers_finish_everything(
    engine_factory: Callable[..., Engine],
) -> None:
    engine = engine_factory("aof-always")
    ids, expected = submit(engine.client, WORKFLOWS)
    running = workers(engine)
    began = time.monotonic()
    wait_progress(engine.client, WORKFLOWS, 0.3)
    before = ended_count(engine)
    engine.server.kill()
    killed = time.monotonic()
    time.sleep(2)  # the workers see refused connections and back off
    engine.restart_server()
    back = time.monotonic()
    at_restart = ended_count(engine)
    assert at_restart < WORKFLOWS, "the run ended before Redis was killed"
    found = wait_all_ended(engine.client, ids, timeout=size(90, 900))
    recovered_in = time.monotonic() - back
    assert all(proc.poll() is None for proc in running), "a worker exited"
    counts = check_exactly_once(engine.client, found, expected)
    record(
        "redis-kill-aof-always",
        ended_before_kill=before,
        ended_at_restart=at_restart,
        restart_seconds=round(back - killed - 2, 1),
        seconds_after_restart=round(recovered_in, 1),
        seconds=round(time.monotonic() - began, 1),
        **counts,
    )


@pytest.mark.parametrize(
    ("paused", "pack_starts"),
    [
        pytest.param(False, False, id="workers-running"),
        pytest.param(True, False, id="workers-paused"),
        pytest.param(True, True, id="workers-paused-packed-starts"),
    ],
)
def test_redis_killed_with_its_aof_tail_cut_is_made_whole_by_recover_from_the_archive(
    engine_factory: Callable[..., Engine], tmp_path: Path, paused: bool, pack_starts: bool
) -> None:
    """``paused``: the workers stay stopped until recover is done (an operator's order),
    so recover, not the workers redoing the lost second, brings workflows forward.
    ``pack_starts``: the start-tasks recover finds in the archive are in packs."""
    engine = engine_factory("aof-everysec", NO_REWRITE, pack_starts=pack_starts)
    archive = tmp_path / "archive"
    engine.receipts(archive, "--no-trim", "--batch-size", "500")
    ids, expected = submit(engine.client, WORKFLOWS)
    time.sleep(1.5)  # everysec: the submissions are on disk; what follows may not be
    tail = aof_tail(engine.server.data_dir)
    submitted_size = tail.stat().st_size
    running = workers(engine)
    sizes: list[tuple[float, int]] = []  # (when, AOF size): what everysec had on disk when
    while task_progress(engine.client, WORKFLOWS) < 0.5:
        sizes.append((time.monotonic(), tail.stat().st_size))
        time.sleep(0.02)
    ended_at_kill = ended_count(engine)
    engine.server.kill()
    killed = time.monotonic()
    if paused:
        for proc in running:
            os.kill(proc.pid, signal.SIGSTOP)
    aof_size = tail.stat().st_size
    # Lose the last second of writes (everysec's window), never the submissions.
    synced = max([n for t, n in sizes if t <= killed - LOST_SECONDS] + [submitted_size])
    cut = aof_size - synced
    with tail.open("r+b") as aof:
        aof.truncate(synced)
    engine.restart_server()
    back = time.monotonic()
    ended_after_restart = ended_count(engine)
    finished_after_restart = sum(
        1 for s in states(engine.client, ids).values() if s.get("status") == "finished"
    )
    recover = subprocess.run(
        [sys.executable, "-m", "lifecycle", "recover", "--archive", str(archive), "--json"]
        + ["--redis-url", engine.url],
        capture_output=True,
        timeout=300,
    )
    # 1: some workflows not restored (listed); the live engine redoes those itself.
    assert recover.returncode in (0, 1), recover.stderr.decode()[-2000:]
    summary = orjson.loads(recover.stdout)
    recovered_after = time.monotonic() - back
    if paused:
        for proc in running:
            os.kill(proc.pid, signal.SIGCONT)
    found = wait_all_ended(engine.client, ids, timeout=size(90, 900))
    recovered_in = time.monotonic() - back
    assert all(proc.poll() is None for proc in running), "a worker exited"
    wrong = {w for w, s in found.items() if s.get("output") != expected[w]}
    assert not wrong and {s["status"] for s in found.values()} == {"finished"}
    # What Redis holds now: still no workflow ended twice, no attempt started twice
    # but for recover's resends.
    ends = Counter(
        e["workflow"]
        for e in decoded(engine.client, KEYS.lifecycle)
        if e.get("kind") == "end-workflow"
    )
    assert not [w for w, n in ends.items() if n > 1]
    starts = Counter(
        e["id"]
        for e in start_tasks(engine.client, KEYS.tasks("default"))
        if e.get("recovered") is not True
    )
    assert not [i for i, n in starts.items() if n > 1]
    record(
        "redis-kill-aof-tail-cut"
        + ("-workers-paused" if paused else "")
        + ("-packed-starts" if pack_starts else ""),
        workflows=len(found),
        cut_kb=cut // 1024,
        aof_kb=aof_size // 1024,
        ended_at_kill=ended_at_kill,
        ended_after_restart=ended_after_restart,
        finished_after_restart=finished_after_restart,
        restored=summary["restored"],
        resent_start_tasks=summary["resent_start_tasks"],
        skipped=len(summary["skipped"]),
        recover_seconds=round(recovered_after, 1),
        seconds_after_restart=round(recovered_in, 1),
    )


def test_submissions_lost_with_the_aof_tail_are_restored_by_recover_from_the_archive(
    engine_factory: Callable[..., Engine], tmp_path: Path
) -> None:
    engine = engine_factory("aof-everysec", NO_REWRITE)
    archive = tmp_path / "archive"
    engine.receipts(archive, "--no-trim")
    lifecycle = engine.lifecycle("lifecycle-0")
    engine.noop("noop-0")
    early, expected = submit(engine.client, 50, "early")
    wait_all_ended(engine.client, early, timeout=30)
    time.sleep(1.5)  # everysec: all of that is on disk
    tail = aof_tail(engine.server.data_dir)
    synced = tail.stat().st_size
    # A backlog: the lifecycle worker has not reached the late submissions yet.
    os.kill(lifecycle.pid, signal.SIGSTOP)
    try:
        late, late_expected = submit(engine.client, 50, "late")
        expected.update(late_expected)
        deadline = time.monotonic() + 10
        while "late49" not in archived_workflows(archive):
            assert time.monotonic() < deadline, "the receipts worker did not archive them"
            time.sleep(0.05)
        engine.server.kill()  # within a second of the submissions: not yet on disk
        with tail.open("r+b") as aof:
            aof.truncate(synced)
        engine.restart_server()
        assert engine.client.hlen(KEYS.workflow("late0")) == 0  # lost in Redis
    finally:
        os.kill(lifecycle.pid, signal.SIGCONT)
    recover = subprocess.run(
        [sys.executable, "-m", "lifecycle", "recover", "--archive", str(archive), "--json"]
        + ["--redis-url", engine.url],
        capture_output=True,
        timeout=120,
    )
    summary = orjson.loads(recover.stdout)
    record(
        "aof-tail-cut-lost-submissions",
        submitted=100,
        lost=50,
        **{
            k: summary[k] if isinstance(summary[k], int) else len(summary[k])
            for k in ("restored", "resent_start_tasks", "skipped")
        },
    )
    found = wait_all_ended(engine.client, early + late, timeout=10)
    assert {w: s.get("output") for w, s in found.items()} == expected


def archived_workflows(directory: Path) -> set[str]:
    from lifecycle.audit.archive import read_archive

    if not directory.exists():
        return set()
    found = set()
    try:
        for _, item in read_archive(directory):
            event = item.get("event")
            if isinstance(event, dict) and "workflow" in event:
                found.add(event["workflow"])
    except Exception:  # a line being written right now: read again later
        pass
    return found
