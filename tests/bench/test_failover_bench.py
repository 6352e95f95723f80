"""bench.failover at a small size, on its own local cluster (3 masters + 3 replicas):
a replica cut off its master loses what the master took meanwhile; the engine redoes
it, replay accepts the redone events, and WAIT tells a submitter what to send again."""

from __future__ import annotations

from pathlib import Path

import orjson

from bench.failover import main


def _figures(tmp_path: Path, *argv: str) -> dict:
    out = tmp_path / "figures.json"
    main([*argv, "--stall", "15", "--json", str(out)])
    (figures,) = orjson.loads(out.read_bytes())
    return figures


def test_a_run_tail_the_promoted_replica_never_got_is_redone_and_replays_equal(
    tmp_path: Path,
) -> None:
    # The submissions reach the replica (WAIT says 1 everywhere); then the replica of
    # partitions 0 and 1 is cut off for 0.3 s of the run before its master is killed.
    figures = _figures(
        tmp_path,
        *("--workflows", "600", "--kill-at", "0", "--replica-lag", "0.3"),
        *("--wait-replicas", "--cut-after-submit"),
    )
    assert figures["replica_acks"] == [1] * 6
    assert figures["killed_partitions"] == [0, 1]
    assert (figures["finished"], figures["stuck"], figures["lost"]) == (600, 0, 0)
    # The advances and answers of that tail were lost: tasks ran again (at least once).
    assert figures["runs_twice"] > 0
    # The archive holds the lost events and their redone copies; replay takes an
    # identical copy for the engine redoing an advance, not for a divergence.
    replay = figures["replay"]
    assert (replay["diverged"], replay["lost_in_redis"]) == (0, 0), replay["divergences"]
    assert replay["live"] == {"equal": 600 + 12}


def test_wait_tells_the_submitter_what_a_cut_off_replica_lacks_and_resubmitting_by_id_starts_it(
    tmp_path: Path,
) -> None:
    figures = _figures(
        tmp_path,
        *("--workflows", "120", "--kill-at", "0", "--replica-lag", "0.3", "--wait-replicas"),
        "--no-audit",
    )
    # Partitions 0 and 1 (the killed master's): WAIT 1 1000 timed out with 0 replicas.
    assert figures["replica_acks"] == [0, 0, 1, 1, 1, 1]
    # Sent again by id after the failover, each started: the replica had none of them.
    assert figures["resubmitted"] > 0
    assert figures["started_again"] == figures["resubmitted"]
    assert (figures["finished"], figures["stuck"], figures["lost"]) == (120, 0, 0)
