"""Partitions: tags spread over the slots, ids routed by their {tag}, the stored count
checked by every process, and a whole deployment of three partitions on one Redis
(workers, receipts, the commands) — the same code a Redis Cluster runs
(tests/lifecycle/test_cluster.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest
import redis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from flowlang.compiler import compile_text
from flowlang.runner import run
from flowstream.cli import main
from lifecycle.cli import EXIT_ERROR, EXIT_OK
from lifecycle.errors import LifecycleError
from lifecycle.keys import Keys
from lifecycle.partitions import (
    PartitionMismatch,
    Partitions,
    archive_root,
    archived_partitions,
    check_unchanged,
    partition_tag,
    routing_part,
    stored_partitions,
)
from lifecycle.submit import start_workflow
from tests.conftest import wait_until
from tests.processes import Processes, wait_until_all_ended

FLOW = "A :x → * { B → C } → :y D; :x → E → :y; D → F|G"


def _slot(prefix: str) -> int:
    return key_slot(f"{prefix}:lifecycle".encode())


@pytest.mark.parametrize("count", [2, 3, 6, 12, 64])
def test_each_partition_tag_maps_to_its_own_equal_share_of_the_slots(count: int) -> None:
    width = REDIS_CLUSTER_HASH_SLOTS / count
    for index in range(count):
        slot = _slot(partition_tag("{flow}", index, count))
        assert index * width - 1 < slot < (index + 1) * width


def test_six_partitions_on_three_masters_give_each_master_two() -> None:
    # The slot ranges `redis-cli --cluster create` gives three masters.
    bounds = [0, 5461, 10923, REDIS_CLUSTER_HASH_SLOTS]
    masters = Counter(
        next(m for m in range(3) if bounds[m] <= _slot(keys.prefix) < bounds[m + 1])
        for keys in Partitions("{flow}", 6).all
    )
    assert masters == {0: 2, 1: 2, 2: 2}


def test_one_partition_is_the_base_prefix_unchanged() -> None:
    partitions = Partitions("{flow}", 1)
    assert partitions.all == (Keys("{flow}"),)
    assert partitions.keys_for("anything") == Keys()


def test_partition_keys_share_one_slot_and_the_limits_stay_under_the_base() -> None:
    keys = Partitions("{app}", 4).keys(2)
    own = {keys.lifecycle, keys.tasks("x"), keys.workflow("w"), keys.timers, keys.schedules}
    assert len({key_slot(k.encode()) for k in own}) == 1
    assert keys.kind_limits == "{app}:kind-limits" and keys.slots("x") == "{app}:slots:x"
    assert keys.partitions == "{app}:partitions"


def test_an_id_routes_by_its_braced_part_and_a_placed_id_joins_its_tag() -> None:
    partitions = Partitions("{flow}", 8)
    assert routing_part("order-{eu}-17") == "eu" and routing_part("a{}b") == "a{}b"
    assert partitions.index_of("x{eu}1") == partitions.index_of("y{eu}2")
    assert len({partitions.index_of(f"w{i}") for i in range(200)}) == 8  # spread
    for n in range(50):
        placed = partitions.place(f"flow-{n}", "nightly")
        assert partitions.index_of(placed) == partitions.index_of_tag("nightly")
    assert partitions.place("flow-1", None) == "flow-1"


def test_an_id_given_outside_its_concurrency_keys_partition_is_refused() -> None:
    partitions = Partitions("{flow}", 8)
    outside = next(
        f"w{n}" for n in range(100) if partitions.index_of(f"w{n}") != partitions.index_of_tag("k")
    )
    with pytest.raises(LifecycleError, match=r"put \{k\} in the id"):
        partitions.check_placed(outside, "k")
    partitions.check_placed(outside + "{k}", "k")


def test_partitions_need_a_hash_tag_and_a_sane_count() -> None:
    with pytest.raises(LifecycleError, match="hash tag"):
        Partitions("flow", 2)
    with pytest.raises(LifecycleError, match="1 to 1,024"):
        Partitions("{flow}", 0)


def test_the_first_worker_stores_the_count_and_a_different_one_is_one_line(
    redis_client: redis.Redis,
) -> None:
    assert stored_partitions(redis_client, "{flow}", None).count == 1  # nothing stored
    with pytest.raises(PartitionMismatch, match="no partitions stored yet"):
        stored_partitions(redis_client, "{flow}", 3)
    assert stored_partitions(redis_client, "{flow}", 3, create=True).count == 3
    assert stored_partitions(redis_client, "{flow}", None).count == 3
    with pytest.raises(PartitionMismatch, match="set up for 3 partitions") as error:
        stored_partitions(redis_client, "{flow}", 4, create=True)
    assert "\n" not in str(error.value)


def test_a_command_told_another_count_exits_2_with_one_line(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stored_partitions(redis_client, "{flow}", 3, create=True)
    flow = tmp_path / "a.flow"
    flow.write_text("A → B\n")
    code = main(["run", str(flow), "--partitions", "2", "--redis-url", redis_url])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR and err.count("\n") == 1 and "set up for 3 partitions" in err


def run_flows_on(
    client_for: dict[str, redis.Redis], partitions: Partitions, count: int
) -> dict[str, object]:
    """Submit ``count`` workflows of FLOW, each to its partition; return the outputs the
    in-memory runner gives, by id."""
    graph = compile_text(FLOW)
    expected = {}
    for i in range(count):
        workflow = f"w{i}"
        keys = partitions.keys_for(workflow)
        start_workflow(client_for[keys.prefix], graph, [i, i + 1], workflow, keys)
        expected[workflow] = run(graph, lambda c: c.input, [i, i + 1]).output
    return expected


def check_each_partition(
    client_for: dict[str, redis.Redis], partitions: Partitions, expected: dict[str, object]
) -> None:
    """Every workflow finished with the runner's output in its own partition, ended
    exactly once there, and each task instance started once."""
    by_partition = partitions.group(expected)
    assert len(by_partition) == partitions.count  # the ids reached every partition
    for index, ids in by_partition.items():
        keys = partitions.keys(index)
        client = client_for[keys.prefix]
        states = wait_until_all_ended(client, ids, timeout=60, keys=keys)
        assert {w: s.get("output") for w, s in states.items()} == {w: expected[w] for w in ids}
        ends = Counter(
            orjson.loads(fields[b"workflow"])
            for _, fields in client.xrange(keys.lifecycle)
            if orjson.loads(fields[b"kind"]) == "end-workflow"
        )
        assert ends == dict.fromkeys(ids, 1)
        starts = Counter(orjson.loads(f[b"id"]) for _, f in client.xrange(keys.tasks("default")))
        assert starts and max(starts.values()) == 1


def test_three_partitions_on_one_redis_run_archive_and_replay_every_workflow(
    processes: Processes,
    redis_client: redis.Redis,
    redis_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    archive = tmp_path / "receipts"
    processes.start("lifecycle", "worker", "--partitions", "3", "--claim-idle", "2")
    # The worker stores the count; the others read it.
    wait_until(lambda: redis_client.get("{flow}:partitions") == b"3", what="the stored count")
    processes.start("workers", "noop", "--kinds", "default")
    processes.start("lifecycle", "receipts", "--archive", str(archive), "--trim-interval", "0.2")
    partitions = Partitions("{flow}", 3)
    clients = {keys.prefix: redis_client for keys in partitions.all}
    expected = run_flows_on(clients, partitions, 30)
    check_each_partition(clients, partitions, expected)

    assert main(["list", "--limit", "0", "--redis-url", redis_url]) == EXIT_OK
    listed = capsys.readouterr().out
    assert all(f"{w}\t" in listed for w in expected)
    assert main(["inspect", "w7", "--json", "--redis-url", redis_url]) == EXIT_OK
    assert orjson.loads(capsys.readouterr().out)["state"] == "finished"

    def replayed() -> int:
        """Workflows replay found equal over every partition's archive (0 on a difference)."""
        code = main(["replay", str(archive), "--redis-url", redis_url])
        out = capsys.readouterr().out
        if code != EXIT_OK or "DIVERGED" in out:
            return 0
        return sum(int(line.split()[0]) for line in out.splitlines() if "replayed (" in line)

    # Every partition has its own archive, and replay walks them all.
    wait_until(lambda: replayed() == 30, timeout=30, what="all 30 archived and replayed equal")
    assert sorted(path.name for path in archive.iterdir()) == [
        "partition-0",
        "partition-1",
        "partition-2",
    ]


def test_a_worker_started_before_the_count_was_stored_stops_when_it_appears(
    processes: Processes, redis_client: redis.Redis
) -> None:
    noop = processes.start("workers", "noop", "--kinds", "default", stderr=True)
    wait_until(
        lambda: (
            redis_client.xinfo_groups(Keys().tasks("default"))
            if redis_client.exists(Keys().tasks("default"))
            else None
        ),
        what="the worker listening with one partition",
    )
    stored_partitions(redis_client, "{flow}", 3, create=True)
    assert noop.wait(timeout=15) == 1
    assert noop.stderr is not None
    assert "set up for 3 partitions" in noop.stderr.read().decode()


def test_receipts_for_a_partition_the_deployment_lacks_is_one_line(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stored_partitions(redis_client, "{flow}", 3, create=True)
    archive = str(tmp_path / "a")
    code = main(["receipts", "--archive", archive, "--partition", "3", "--redis-url", redis_url])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR and err.count("\n") == 1
    assert "--partition 3: the deployment has partitions 0 to 2" in err


def test_deployment_submit_places_a_keyed_workflow_in_its_keys_partition(
    redis_client: redis.Redis, redis_url: str
) -> None:
    from lifecycle.deployment import Deployment
    from rqse.cluster import Connections
    from rqse.connection import resolve_url

    stored_partitions(redis_client, "{flow}", 4, create=True)
    deployment = Deployment(Connections.open(resolve_url(redis_url, None)))
    try:
        graph = compile_text("A → B")
        placed = [
            deployment.submit(graph, {"n": n}, concurrency_key="nightly", max_running=2)
            for n in range(5)
        ]
        home = deployment.partitions.keys(deployment.partitions.index_of_tag("nightly"))
        sent = [
            orjson.loads(fields[b"workflow"]) for _, fields in redis_client.xrange(home.lifecycle)
        ]
        assert sent == placed
        with pytest.raises(LifecycleError, match=r"put \{nightly\} in the id"):
            outside = next(
                f"w{n}"
                for n in range(100)
                if deployment.partitions.index_of(f"w{n}")
                != deployment.partitions.index_of(placed[0])
            )
            deployment.submit(graph, None, outside, concurrency_key="nightly", max_running=2)
    finally:
        deployment.close()


def test_partitions_are_refused_on_a_redis_holding_a_one_partition_deployment(
    redis_client: redis.Redis,
) -> None:
    start_workflow(redis_client, compile_text("A"), None, "early")  # {flow}: one partition
    with pytest.raises(PartitionMismatch, match="holds a deployment of one partition"):
        stored_partitions(redis_client, "{flow}", 3, create=True)
    assert redis_client.get("{flow}:partitions") is None
    assert stored_partitions(redis_client, "{flow}", 1, create=True).count == 1


def test_a_submission_that_a_new_count_overtook_is_refused(redis_client: redis.Redis) -> None:
    taken = stored_partitions(redis_client, "{flow}", None)  # none stored: one partition
    redis_client.set("{flow}:partitions", 3)  # a lifecycle worker stored it meanwhile
    with pytest.raises(PartitionMismatch, match="nothing will read it; send it again"):
        check_unchanged(redis_client, taken)
    check_unchanged(redis_client, stored_partitions(redis_client, "{flow}", None))


def test_an_archive_missing_some_partitions_folders_replays_with_the_stored_count(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    stored_partitions(redis_client, "{flow}", 4, create=True)
    (tmp_path / "partition-1").mkdir()  # partitions 0, 2, 3 archived elsewhere
    assert archived_partitions(tmp_path, "{flow}").count == 2  # the folders alone
    assert archived_partitions(tmp_path, "{flow}", 4).count == 4
    assert archive_root(str(tmp_path / "partition-1")) == str(tmp_path)
    assert archive_root(str(tmp_path)) == str(tmp_path)


def test_a_dead_letter_id_in_two_partitions_asks_which_and_purge_counts_them_all(
    redis_client: redis.Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    partitions = stored_partitions(redis_client, "{flow}", 3, create=True)
    for keys in partitions.all[:2]:
        fields = {"kind": orjson.dumps("end-task"), "workflow": orjson.dumps("w")}
        redis_client.xadd(f"{keys.lifecycle}:dead", fields, id="1-1")
    url = ["--redis-url", redis_url]
    assert main(["dead-letters", "show", "1-1", *url]) == EXIT_ERROR
    assert "is in several partitions (0, 1): add --partition I" in capsys.readouterr().err
    assert main(["dead-letters", "show", "1-1", "--partition", "1", "--json", *url]) == EXIT_OK
    capsys.readouterr()
    assert main(["dead-letters", "purge", "--yes", *url]) == EXIT_OK
    assert "2 deleted" in capsys.readouterr().out


def test_ids_grouped_by_partition_keep_their_order() -> None:
    partitions = Partitions("{flow}", 4)
    ids = [f"w{n}" for n in range(40)]
    grouped = partitions.group(ids)
    assert sorted(w for group in grouped.values() for w in group) == sorted(ids)
    for index, group in grouped.items():
        assert all(partitions.index_of(w) == index for w in group)
        assert group == [w for w in ids if partitions.index_of(w) == index]


def test_a_count_out_of_range_is_said_before_what_is_stored(redis_client: redis.Redis) -> None:
    with pytest.raises(LifecycleError, match="--partitions 0: expected 1 to 1,024"):
        stored_partitions(redis_client, "{flow}", 0)
