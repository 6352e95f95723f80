"""The engine on a real Redis Cluster (3 masters + 3 replicas on loopback): six
partitions, two on each master; the suite of flows runs to the runner's outputs,
archived per partition and replayed equal; a master killed mid-run fails over to
its replica and every workflow still ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from flowlang.compiler import compile_text
from flowstream.cli import main
from lifecycle.cli import EXIT_OK
from lifecycle.deployment import Deployment
from lifecycle.errors import UnknownWorkflow
from lifecycle.history import inspected
from lifecycle.keys import Keys
from lifecycle.kind_limits import set_kind_limit
from rqse.cluster import Connections
from rqse.connection import resolve_url
from rqse.server import LocalCluster
from tests.conftest import wait_until
from tests.lifecycle.partitioned import check_suite, submit_suite
from tests.processes import Processes


def _deployment(url: str) -> Deployment:
    return Deployment(Connections.open(resolve_url(url, None), cluster=True))


def _start_engine(processes: Processes, client: redis.Redis, archive: Path | None = None) -> None:
    """The first lifecycle worker stores the count; the others start once it is stored
    (one started before would run with one partition, then stop: CountWatch)."""
    processes.start("lifecycle", "worker", "--cluster", "--partitions", "6", "--claim-idle", "2")
    wait_until(lambda: client.get("{flow}:partitions") == b"6", what="the stored count")
    processes.start("lifecycle", "worker", "--cluster", "--claim-idle", "2")
    processes.start("workers", "noop", "--cluster", "--kinds", "default")
    if archive is not None:
        processes.start(
            "lifecycle", "receipts", "--cluster", "--archive", str(archive), "--no-trim"
        )


def test_six_partitions_on_three_masters_run_the_suite_and_replay_it_equal(
    redis_cluster: LocalCluster,
    cluster_client: redis.RedisCluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    processes = Processes(redis_cluster.url)
    archive = tmp_path / "receipts"
    deployment = _deployment(redis_cluster.url)
    try:
        _start_engine(processes, deployment.client, archive)
        wait_until(lambda: cluster_client.get("{flow}:partitions") == b"6", what="the stored count")
        masters = {
            deployment.connections.pool_for(k.prefix).address for k in deployment.partitions.all
        }
        assert len(masters) == 3  # the six partitions spread over every master
        expected = submit_suite(deployment, per_flow=4)
        check_suite(deployment, expected)

        url = ["--redis-url", redis_cluster.url, "--cluster"]
        assert main(["inspect", "f1-w2", "--json", *url]) == EXIT_OK
        assert '"state": "finished"' in capsys.readouterr().out

        def replayed() -> int:
            code = main(["replay", str(archive), *url])
            out = capsys.readouterr().out
            if code != EXIT_OK or "DIVERGED" in out:
                return 0
            return sum(int(line.split()[0]) for line in out.splitlines() if "replayed (" in line)

        wait_until(lambda: replayed() == len(expected), timeout=30, what="every run replayed")
    finally:
        processes.stop_all()
        deployment.close()


def test_a_kind_limit_and_a_concurrency_key_hold_across_the_clusters_partitions(
    redis_cluster: LocalCluster, cluster_client: redis.RedisCluster
) -> None:
    processes = Processes(redis_cluster.url)
    deployment = _deployment(redis_cluster.url)
    try:
        _start_engine(processes, deployment.client)
        # The limit lives under {flow}, on another master than most partitions.
        set_kind_limit(deployment.client, deployment.home, "lim", 2)
        timed = ("workers", "run", "tests.lifecycle.cluster_tasks:Timed", "--cluster")
        processes.start(*timed, "--concurrency", "3")
        graph = compile_text("<[1, 2, 3, 4]> → * lim:work")
        ids = [f"lim-{n}" for n in range(6)]
        for workflow in ids:
            deployment.submit(graph, None, workflow)
        keyed = [
            deployment.submit(compile_text("A → B"), {"n": n}, concurrency_key="k", max_running=2)
            for n in range(8)
        ]
        runs = []
        for workflow in ids + keyed:
            place = deployment.for_workflow(workflow)
            output = wait_until(
                lambda p=place, w=workflow: _output(*p, w), timeout=60, what=workflow
            )
            if workflow in ids:
                runs += output
        assert len(runs) == 24
        moments = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
        running = most = 0
        for _, step in moments:
            running += step
            most = max(most, running)
        assert most == 2  # 18 listeners on six partitions, at most two tasks at once
    finally:
        processes.stop_all()
        deployment.close()


def _output(client: redis.Redis, keys: Keys, workflow: str) -> Any:
    """The workflow's output once it finished (True for an empty one), else None."""
    try:
        data = inspected(client, keys, workflow)
    except UnknownWorkflow:
        return None  # not advanced yet
    if data["state"] != "finished":
        return None
    return data["output"] or True


def test_a_master_killed_mid_run_fails_over_and_every_workflow_ends() -> None:
    with LocalCluster(masters=3, replicas=1) as cluster:
        processes = Processes(cluster.url)
        deployment = _deployment(cluster.url)
        try:
            _start_engine(processes, deployment.client)
            # Every worker up and listening on every partition before the kill.
            check_suite(deployment, submit_suite(deployment, 1, prefix="up"), everywhere=False)
            expected = submit_suite(deployment, per_flow=10)
            # Acknowledged by a replica too (WAIT): the submissions survive the kill; what
            # the master acknowledged after its replica's last copy is lost with it, and
            # redone from the consistent point the replica holds.
            for client, _ in deployment.each_partition():
                assert client.wait(1, 5000) == 1
            cluster.kill(cluster.nodes[1])  # a master: two partitions
            check_suite(deployment, expected, timeout=90)
            after = submit_suite(deployment, per_flow=2, prefix="after")
            check_suite(deployment, after, timeout=60)
        finally:
            processes.stop_all()
            deployment.close()
