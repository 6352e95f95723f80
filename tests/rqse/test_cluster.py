"""Redis Cluster: a local cluster for the tests, and a pool per slot on its master."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.cluster import RedisCluster

from rqse import (
    ConfigurationError,
    EventClient,
    EventListener,
    RedisCommandError,
    RedisSettings,
    fastpipe,
    message,
)
from rqse.cluster import _REFRESH_INTERVAL, Connections, SlotPool
from rqse.connection import is_transient, redis_arguments
from rqse.server import CLUSTER_SLOTS, LocalCluster, free_port, slot_ranges
from tests.conftest import wait_until
from tests.rqse.helpers import Running


@pytest.fixture
def connections(redis_cluster: LocalCluster, cluster_client: RedisCluster) -> Iterator[Connections]:
    with Connections.open(RedisSettings.resolve(url=redis_cluster.url)) as opened:
        yield opened


def _master_address(client: RedisCluster, key: str) -> tuple[str, int]:
    node = client.get_node_from_key(key)
    return node.host, int(node.port)


def _write_until_it_works(client: redis.Redis, key: str, timeout: float) -> list[str]:
    """SET ``key`` until it works, retrying transient errors as callers do; the errors."""
    deadline = time.monotonic() + timeout
    errors: list[str] = []
    while True:
        try:
            client.set(key, "after")
            return errors
        except redis.RedisError as error:
            assert is_transient(error), f"not transient: {error!r}"
            errors.append(type(error).__name__)
            if time.monotonic() > deadline:
                pytest.fail(f"no write within {timeout}s of the kill: {errors[-3:]}")
            time.sleep(0.05)


def test_slot_ranges_are_those_redis_cli_gives() -> None:
    assert slot_ranges(3) == [(0, 5460), (5461, 10922), (10923, 16383)]
    assert slot_ranges(2) == [(0, 8191), (8192, 16383)]
    assert slot_ranges(1) == [(0, 16383)]


def test_a_local_cluster_has_three_masters_three_replicas_and_every_slot_covered(
    redis_cluster: LocalCluster, cluster_client: RedisCluster
) -> None:
    assert len(redis_cluster.nodes) == 6
    for node in redis_cluster.nodes:
        info = redis.Redis(port=node.port).execute_command("CLUSTER INFO")
        assert info["cluster_state"] == "ok"
        assert int(info["cluster_slots_assigned"]) == CLUSTER_SLOTS
    nodes = redis.Redis(port=redis_cluster.nodes[0].port).execute_command("CLUSTER NODES")
    masters = {v["node_id"]: v for v in nodes.values() if "master" in v["flags"]}
    replicas = [v for v in nodes.values() if "slave" in v["flags"]]
    assert len(masters) == 3 and len(replicas) == 3
    assert sorted(r["master_id"] for r in replicas) == sorted(masters)
    ranges = sorted(tuple(map(int, m["slots"][0])) for m in masters.values())
    assert ranges == slot_ranges(3)


def test_open_detects_cluster_mode_and_lists_the_masters(
    redis_cluster: LocalCluster, connections: Connections
) -> None:
    assert connections.cluster is True
    ports = {port for _, port in connections.masters()}
    assert ports == {node.port for node in redis_cluster.nodes[:3]}


def test_cluster_mode_asked_of_a_single_server_is_one_clear_error(redis_url: str) -> None:
    settings = RedisSettings.resolve(url=redis_url)
    with pytest.raises(ConfigurationError) as raised:
        Connections.open(settings, cluster=True)
    text = str(raised.value)
    assert "not in cluster mode" in text and "--cluster" in text and "\n" not in text


def test_bad_cluster_settings_are_one_line_naming_the_url(redis_cluster: LocalCluster) -> None:
    with pytest.raises(ConfigurationError, match=r"only database 0; .* asks for database 3"):
        Connections.open(RedisSettings.resolve(url=f"{redis_cluster.url}/3"), cluster=True)
    # Unreachable: redis-py's own error, as a first command would raise (and the CLIs
    # turn into "cannot reach Redis at <url>").
    with pytest.raises(redis.ConnectionError):
        Connections.open(RedisSettings.resolve(url=f"redis://127.0.0.1:{free_port()}"))


def test_a_single_server_gives_its_one_pool_for_every_key(redis_url: str) -> None:
    settings = RedisSettings.resolve(url=redis_url)
    for cluster in (None, False):
        with Connections.open(settings, cluster=cluster) as single:
            assert single.cluster is False
            pool = single.pool_for("{a}:x")
            assert pool is single.pool_for("{b}:y") and not isinstance(pool, SlotPool)
            assert single.client_for("{a}:x").ping()
            port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
            assert single.masters()[0][1] == port


def test_pool_for_a_key_is_on_the_master_of_its_slot_and_shared_by_its_hash_tag(
    connections: Connections, cluster_client: RedisCluster
) -> None:
    tags = [f"{{p{index}}}" for index in range(12)]
    assert len({_master_address(cluster_client, tag) for tag in tags}) == 3  # all masters used
    for tag in tags:
        pool = connections.pool_for(f"{tag}:stream")
        assert isinstance(pool, SlotPool)
        assert pool is connections.pool_for(f"{tag}:other")
        assert pool.address == _master_address(cluster_client, tag)
    assert connections.pool_for("{p0}:a") is not connections.pool_for("{p1}:a")
    assert [connections.keyslot(f"{t}:x") for t in tags] == [
        cluster_client.keyslot(t) for t in tags
    ]


def test_transactions_scripts_and_raw_pipelines_with_one_hash_tag_run_through_a_slot_pool(
    connections: Connections, cluster_client: RedisCluster
) -> None:
    a, b = "{order-7}:a", "{order-7}:b"
    client = connections.client_for(a)
    with client.pipeline(transaction=True) as pipe:
        pipe.watch(a)
        pipe.multi()
        pipe.set(a, 1)
        pipe.set(b, 2)
        assert pipe.execute() == [True, True]
    total = client.eval("return redis.call('incr', KEYS[1]) + redis.call('incr', KEYS[2])", 2, a, b)
    assert total == 5
    fastpipe.execute_transaction(client, [("INCR", a), ("INCR", b)])
    assert cluster_client.mget(a, b) == [b"3", b"4"]


def test_an_event_client_and_a_listener_round_trip_through_slot_pools(
    connections: Connections, cluster_client: RedisCluster
) -> None:
    stream = "{orders}:jobs"
    seen: list[str] = []

    class Recorder(EventListener):
        def process(self, event_id: str, event: dict[str, object]) -> bool:
            seen.append(str(event["kind"]))
            return True

    with EventClient(stream, pool=connections.pool_for(stream)) as client:
        client.append_many([message(kind="a"), message(kind="b"), message(kind="c")])
    listener = Recorder(stream, "g", pool=connections.pool_for(stream), handle_signals=False)
    assert listener.listen(max_events=3) == 3
    assert seen == ["a", "b", "c"]
    assert cluster_client.xpending(stream, "g")["pending"] == 0


def test_after_its_master_is_killed_the_same_pool_writes_to_the_promoted_replica(
    run_listener: Callable[..., Running],
) -> None:
    key, stream = "{failover}:counter", "{failover}:jobs"
    seen: list[str] = []

    class Recorder(EventListener):
        def process(self, event_id: str, event: dict[str, object]) -> bool:
            seen.append(str(event["kind"]))
            return True

    with (
        LocalCluster(masters=3, replicas=1) as cluster,
        Connections.open(RedisSettings.resolve(url=cluster.url), cluster=True) as connections,
    ):
        pool = connections.pool_for(key)
        assert isinstance(pool, SlotPool) and pool is connections.pool_for(stream)
        client = redis.Redis(connection_pool=pool)
        script = client.register_script("return redis.call('incr', KEYS[1])")
        events = EventClient(stream, pool=pool)
        events.append(message(kind="before"))
        run_listener(Recorder(stream, "g", pool=pool, handle_signals=False, block_ms=200))
        wait_until(lambda: seen == ["before"], what="the event written before the kill")
        client.set(key, 1)
        client.execute_command("WAIT", 1, 2000)  # on the replica before the kill
        old = pool.address
        killed = time.monotonic()
        cluster.kill(cluster.node_at(old[1]))
        errors = _write_until_it_works(client, key, timeout=20)
        elapsed = time.monotonic() - killed
        print(f"failover: first write {elapsed:.2f}s after the kill, {len(errors)} retries")
        assert pool is connections.pool_for(key) and pool.address != old
        assert errors  # the dead master was noticed, not skipped by luck
        events.append(message(kind="after"))
        # The listener was blocked on the dead master: it reconnects, to the new one.
        wait_until(lambda: "after" in seen, timeout=15, what="the listener after the failover")
        # The new master may lack the script: NOSCRIPT is answered by loading it.
        client.set(key, 10)
        client.execute_command("SCRIPT", "FLUSH")
        assert script(keys=[key]) == 11


def test_with_every_node_down_a_slot_pool_raises_only_connection_errors() -> None:
    with (
        LocalCluster(masters=1, replicas=0) as cluster,
        Connections.open(RedisSettings.resolve(url=cluster.url)) as connections,
    ):
        client = connections.client_for("{down}:x")
        client.set("{down}:x", 1)
        cluster.kill(cluster.nodes[0])
        for _ in range(3):  # the topology read fails too: never in the caller's place
            with pytest.raises(redis.ConnectionError):
                client.set("{down}:x", 2)
            time.sleep(_REFRESH_INTERVAL)


def test_a_manual_failover_moves_the_pool_through_moved_replies() -> None:
    key = "{moved}:x"
    with (
        LocalCluster(masters=1, replicas=1) as cluster,
        Connections.open(RedisSettings.resolve(url=cluster.url)) as connections,
    ):
        pool = connections.pool_for(key)
        client = redis.Redis(connection_pool=pool)
        fastpipe.execute(client, [("SET", key, "before")])  # a connection to keep idle
        replica = cluster.replicas_of(0)[0]
        redis.Redis(port=replica.port).execute_command("CLUSTER", "FAILOVER")
        # The old master stays up, as a replica: only its replies say the slot moved.
        deadline, refused = time.monotonic() + 15, []
        while pool.address != ("127.0.0.1", replica.port):
            try:
                replies = fastpipe.execute(client, [("SET", key, "after")])
            except redis.RedisError as error:
                replies = [error]
            refused += [type(r).__name__ for r in replies if r != b"OK"]
            assert all(r == b"OK" or is_transient(r) for r in replies), replies
            assert time.monotonic() < deadline, "the pool never followed the failover"
            time.sleep(0.05)
        assert "MovedError" in refused
        assert fastpipe.execute(client, [("SET", key, "after")]) == [b"OK"]
        assert client.get(key) == b"after"


def test_cluster_redirects_and_failover_errors_are_transient() -> None:
    errors = [
        redis.exceptions.MovedError("3999 127.0.0.1:7002"),
        redis.exceptions.AskError("3999 127.0.0.1:7002"),
        redis.ResponseError("MOVED 3999 127.0.0.1:7002"),
        redis.exceptions.ClusterDownError("The cluster is down"),
        redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
        redis.exceptions.MasterDownError("Link with MASTER is down"),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
    ]
    assert [is_transient(error) for error in errors] == [True] * len(errors)
    assert not is_transient(redis.exceptions.ClusterCrossSlotError("Keys in request"))


def test_every_cli_gets_a_cluster_flag_that_is_none_when_omitted() -> None:
    parser = argparse.ArgumentParser()
    redis_arguments(parser)
    assert parser.parse_args([]).cluster is None
    assert parser.parse_args(["--cluster"]).cluster is True


def test_the_urls_credentials_reach_the_topology_client_and_every_slot_pool_or_say_why_not() -> (
    None
):
    # The default user may form the cluster but not write: only the URL's user can.
    default = "default on nopass ~* &* -@all +ping +cluster +info +client"
    alice = "alice on >s3cret ~* &* +@all"
    bob = "bob on >pw ~* &* -@all +ping +info +client +set"  # no CLUSTER SLOTS
    extra = ["--user", *default.split(), "--user", *alice.split(), "--user", *bob.split()]
    with LocalCluster(masters=1, replicas=0, extra_args=extra) as cluster:
        port = cluster.nodes[0].port
        settings = RedisSettings.resolve(url=f"redis://alice:s3cret@127.0.0.1:{port}")
        with Connections.open(settings, cluster=True) as connections:
            client = connections.client_for("{c}:x")
            assert client.set("{c}:x", 1) and client.acl_whoami() == "alice"
        with pytest.raises(redis.exceptions.NoPermissionError):
            redis.Redis(port=port).set("{c}:x", 1)
        with pytest.raises(RedisCommandError, match=r"bob:\*\*\*@.*no permissions.*cluster\|slots"):
            Connections.open(RedisSettings.resolve(url=f"redis://bob:pw@127.0.0.1:{port}"))


def test_a_user_that_may_not_ask_about_cluster_mode_is_taken_for_a_single_server(
    redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.acl_setuser(
        "narrow", enabled=True, passwords=["+pw"], keys=["*"], commands=["-@all", "+ping", "+set"]
    )
    try:
        url = redis_url.replace("redis://", "redis://narrow:pw@")
        with Connections.open(RedisSettings.resolve(url=url)) as single:
            assert single.cluster is False
            assert single.client_for("k").set("k", 1)
    finally:
        redis_client.acl_deluser("narrow")
