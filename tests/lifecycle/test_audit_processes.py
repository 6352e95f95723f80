"""The whole audit story with real processes, SIGKILLs included.

1,000 workflows (``AUDIT_WORKFLOWS`` for more) with joins, iteration, a guard
and ``$retries``; simulating task workers that fail 10 % of attempts; two
lifecycle workers, one SIGKILLed and restarted; the receipts worker SIGKILLed
and restarted twice while trimming the streams. Afterwards, from the archive:
every entry Redis ever added to every engine stream is there exactly once,
and replay reproduces every workflow's final state, output and task records.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import redis

from flowlang.compiler import compile_text
from lifecycle.audit.report import audit_archive
from lifecycle.keys import RECEIPTS_GROUP
from lifecycle.submit import start_workflows
from tests.conftest import wait_until
from tests.lifecycle.audit_helpers import (
    FLOW,
    KEYS,
    assert_exactly_once,
    engine_streams,
    flow_input,
)
from tests.processes import Processes, wait_until_all_ended

WORKFLOWS = int(os.environ.get("AUDIT_WORKFLOWS", "1000"))


def archive_caught_up(client: redis.Redis) -> bool:
    """The receipts group has read everything and holds nothing unacknowledged."""
    for stream in engine_streams(client):
        info = client.xinfo_stream(stream)
        groups = {g["name"].decode(): g for g in client.xinfo_groups(stream)}
        group = groups.get(RECEIPTS_GROUP)
        if (
            group is None
            or group["pending"]
            or (group["last-delivered-id"] != info["last-generated-id"])
        ):
            return False
    return True


def test_every_event_is_archived_once_and_replay_reproduces_every_workflow_despite_sigkills(
    processes: Processes, redis_client: redis.Redis, tmp_path: Path
) -> None:
    archive = str(tmp_path / "archive")

    def receipts():
        return processes.start(
            "lifecycle",
            "receipts",
            "--archive",
            archive,
            "--trim-interval",
            "0.2",
            "--batch-size",
            "500",
        )

    graph = compile_text(FLOW)
    ids = [f"w{n}" for n in range(WORKFLOWS)]
    recorder = [receipts()]
    start_workflows(redis_client, graph, [flow_input(n) for n in range(WORKFLOWS)], ids)
    processes.lifecycle("steady", claim_idle=1.0)
    victim = [processes.lifecycle("victim", claim_idle=1.0)]
    for n in range(2):
        processes.start(
            "workers",
            "simulate",
            "--kinds",
            "default",
            "--delay-max",
            "0",
            "--failures",
            "10",
            "--seed",
            str(n),
            "--consumer",
            f"sim-{n}",
        )
    began = time.monotonic()
    kills = {"lifecycle": 0, "receipts": 0}
    peaks: dict[str, int] = {}

    def chaos() -> None:
        for stream in engine_streams(redis_client):
            peaks[stream] = max(peaks.get(stream, 0), redis_client.xlen(stream))
        elapsed = time.monotonic() - began
        if kills["lifecycle"] == 0 and elapsed > 0.8:
            victim[0].kill()  # SIGKILL: its batch stays pending until claimed
            victim[0].wait()
            victim[0] = processes.lifecycle("victim", claim_idle=1.0)
            kills["lifecycle"] += 1
        if kills["receipts"] < 2 and elapsed > 0.5 + 1.0 * kills["receipts"]:
            recorder[0].kill()  # SIGKILL between write, fsync and ack, wherever it falls
            recorder[0].wait()
            recorder[0] = receipts()
            kills["receipts"] += 1

    states = wait_until_all_ended(redis_client, ids, timeout=120, during=chaos)
    assert kills == {"lifecycle": 1, "receipts": 2}, "the run ended before the kills"
    wait_until(lambda: archive_caught_up(redis_client), 60, "the archive to catch up")
    recorder[0].terminate()
    assert recorder[0].wait(timeout=10) == 0

    counts = assert_exactly_once(redis_client, Path(archive))
    assert sum(counts.values()) > WORKFLOWS * 20
    report = audit_archive(archive, KEYS, client=redis_client)
    assert report.ok, report.first_problem
    assert len(report.workflows) == WORKFLOWS
    assert {w.live for w in report.workflows} == {"equal"}
    replayed = {w.workflow: (w.state.status, w.state.output) for w in report.workflows}
    live = {w: (s["status"], s.get("output")) for w, s in states.items()}
    assert replayed == live
    retried = sum(1 for w in report.workflows for _, _, e in w.emitted if e.get("attempt", 1) > 1)
    assert retried > 0, "no task was retried: the test did not exercise retries"
    print(f"\naudit: {sum(counts.values())} entries archived, peaks {peaks}, retries {retried}")
