"""Redis Cluster: a plain connection pool per hash slot, on the master that owns it.

Everything rqse does on a stream (MULTI/EXEC with WATCH, Lua scripts, a
multi-stream XREADGROUP, the raw pipelining of :mod:`rqse.fastpipe`) needs all
its keys on one node. A user of rqse that puts every key of one unit of work
under one hash tag can therefore keep plain ``redis.Redis`` clients: one pool
per slot, pointed at the master that owns the slot, is all the routing needed.
:class:`Connections` gives those pools, or the one pool of a single server.

Routing and topology come from redis-py's :class:`redis.cluster.RedisCluster`
(its slot map, its ``CLUSTER SLOTS`` discovery and its CRC16); nothing here
parses the topology. A :class:`SlotPool` follows failovers by itself: when its
master stops answering, or answers MOVED, READONLY, CLUSTERDOWN, TRYAGAIN or
MASTERDOWN, the topology is read again and new and reused connections go to the
slot's master of the moment. The caller sees the error (transient:
:func:`rqse.connection.is_transient`) and retries as it does for any Redis
weather; it never resets anything.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import (
    ClusterDownError,
    MovedError,
    ReadOnlyError,
    TryAgainError,
)

from rqse.connection import RedisSettings, scrub, translate_errors
from rqse.errors import ConfigurationError, RedisCommandError, RedisUnavailable
from rqse.weather import is_weather

__all__ = ["Connections", "SlotPool"]

log = logging.getLogger(__name__)

# Replies saying the slot is served elsewhere (or nowhere, for now): the topology is
# read again. ClusterDownError covers MASTERDOWN.
_MOVED = (MovedError, ReadOnlyError, ClusterDownError, TryAgainError)
# A failing master makes every caller fail at once: one topology read per this many
# seconds is enough (callers retry with backoff meanwhile).
_REFRESH_INTERVAL = 0.1


class _SlotConnectionMixin:
    """A connection that asks its :class:`SlotPool` where to connect, and tells it when
    the answer it got says the slot has moved."""

    slot_pool: SlotPool | None = None
    host: str
    port: int

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        if getattr(self, "_sock", None) is not None or self.slot_pool is None:
            super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
            return
        self.host, self.port = self.slot_pool.address
        try:
            super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
        except (redis.ConnectionError, redis.TimeoutError):
            self.slot_pool.topology_changed()
            raise

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except (*_MOVED, redis.ConnectionError, redis.TimeoutError):
            if self.slot_pool is not None:
                self.slot_pool.topology_changed()
            raise

    def check_replies(self, replies: list[Any]) -> None:
        """Called by :mod:`rqse.fastpipe`, which reads replies past ``read_response``
        and returns error replies as values."""
        if self.slot_pool is not None and any(isinstance(r, _MOVED) for r in replies):
            self.slot_pool.topology_changed()


class SlotConnection(_SlotConnectionMixin, redis.Connection):
    """A TCP connection to the master of one slot."""


class SlotSSLConnection(_SlotConnectionMixin, redis.SSLConnection):
    """A TLS connection to the master of one slot."""


class SlotPool(redis.ConnectionPool):
    """A connection pool on the master that owns one hash slot, following failovers.

    Made by :meth:`Connections.pool_for`. :attr:`address` is the master it connects
    to now; when the topology says another node took the slot over, idle
    connections are closed and those in use are dropped when released, so every
    command after that goes to the new master.
    """

    def __init__(
        self, connections: Connections, slot: int, address: tuple[str, int], **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.connections = connections
        self.slot = slot
        self.address = address
        self.connection_kwargs["host"], self.connection_kwargs["port"] = address

    def make_connection(self) -> Any:
        connection: Any = super().make_connection()
        connection.slot_pool = self
        return connection

    def owns_connection(self, connection: Any) -> int:
        # A connection to a former master is not taken back: the next one goes to the
        # new master. A closed one will connect to the right place.
        moved = connection._sock is not None and (connection.host, connection.port) != (
            self.address
        )
        return not moved and super().owns_connection(connection)

    def topology_changed(self) -> None:
        """A connection saw the slot's master fail or move: read the topology again."""
        self.connections.refresh()

    def move_to(self, address: tuple[str, int]) -> None:
        """Point the pool at ``address``, the slot's master now."""
        with self._lock:
            if address == self.address:
                return
            log.warning(
                "slot %d: master moved from %s:%d to %s:%d", self.slot, *self.address, *address
            )
            self.address = address
            self.connection_kwargs["host"], self.connection_kwargs["port"] = address
            for connection in self._available_connections:
                connection.disconnect()


class Connections:
    """What a process uses to reach Redis, a Redis Cluster or a single server.

    :meth:`pool_for` gives the pool for a key: on a cluster a :class:`SlotPool` on the
    master owning the key's slot (the same object for every key of that slot), on a
    single server its one pool. Keys used together in one command, transaction or
    script must share a hash tag (``{tag}``), as anywhere on Redis Cluster.
    """

    def __init__(
        self,
        settings: RedisSettings,
        pool: redis.ConnectionPool,
        cluster: RedisCluster | None,
    ) -> None:
        self.settings = settings
        self.cluster = cluster is not None
        self._pool = pool  # the URL's node (the single server, or where discovery started)
        self._cluster = cluster
        self._pools: dict[int, SlotPool] = {}
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._refreshed = 0.0

    @classmethod
    def open(
        cls, settings: RedisSettings, *, cluster: bool | None = None, **pool_options: Any
    ) -> Connections:
        """Connect to the server of ``settings``. ``cluster``: None detects cluster mode
        (``INFO cluster`` on the URL's node), True requires it, False uses the URL's
        node as a single server. ``pool_options`` go to every pool
        (:meth:`RedisSettings.pool`). Raises :class:`ConfigurationError` (one
        printable line) for settings that cannot work; redis-py's error when the URL's
        node cannot be reached or refuses the question, as a first command would."""
        pool = settings.pool(**pool_options)
        where = settings.masked_url
        if cluster is False:
            return cls(settings, pool, None)
        db = int(pool.connection_kwargs.get("db") or 0)
        if cluster and db != 0:
            pool.disconnect()
            raise ConfigurationError(
                f"Redis Cluster has only database 0; {where} from {settings.origin} "
                f"asks for database {db}"
            )
        try:
            # Unreachable or refusing: redis-py's error as is, as from a first command
            # (the CLIs say "cannot reach Redis at ..." for it).
            enabled = _cluster_enabled(redis.Redis(connection_pool=pool))
            if enabled is False and cluster:
                raise ConfigurationError(
                    f"Redis at {where} (from {settings.origin}) is not in cluster mode "
                    "(cluster_enabled:0), but cluster mode was asked for (--cluster)"
                )
            if enabled is None and cluster is None:
                # A user restricted to its keys' commands, on a single server (on a
                # cluster it would need CLUSTER SLOTS, as every cluster client does).
                log.info(
                    "%s: may not run INFO or CLUSTER SLOTS; using it as a single server "
                    "(pass --cluster for a cluster)",
                    where,
                )
            if not (enabled or cluster):
                return cls(settings, pool, None)
            return cls(settings, pool, _open_cluster(settings, pool))
        except BaseException:
            pool.disconnect()
            raise

    def pool_for(self, key: str) -> redis.ConnectionPool:
        """The pool on the master that owns ``key``'s slot (single server: the pool)."""
        if self._cluster is None:
            return self._pool
        slot = self.keyslot(key)
        pool = self._pools.get(slot)
        if pool is not None:
            return pool
        with self._lock:
            pool = self._pools.get(slot)
            if pool is None:
                pool = self._new_pool(slot, key)
                self._pools[slot] = pool
        return pool

    def keyslot(self, key: str) -> int:
        """The hash slot of ``key`` (redis-py's CRC16 of its hash tag), cluster or not."""
        return int(key_slot(key.encode()))

    def client_for(self, key: str) -> redis.Redis:
        """A client on :meth:`pool_for` ``(key)``."""
        return redis.Redis(connection_pool=self.pool_for(key))

    def masters(self) -> list[tuple[str, int]]:
        """(host, port) of each master (a single server: its own; a unix socket:
        (path, 0))."""
        if self._cluster is None:
            kwargs = self._pool.connection_kwargs
            if "path" in kwargs:
                return [(str(kwargs["path"]), 0)]
            return [(str(kwargs.get("host", "localhost")), int(kwargs.get("port", 6379)))]
        return sorted((node.host, int(node.port)) for node in self._cluster.get_primaries())

    def refresh(self, force: bool = False) -> None:
        """Read the cluster's topology again and move every slot pool whose master
        changed. At most once per 0.1 s (unless ``force``); concurrent callers wait
        for the read in progress rather than start their own."""
        if self._cluster is None:
            return
        with self._refresh_lock:
            if not force and time.monotonic() - self._refreshed < _REFRESH_INTERVAL:
                return
            try:
                self._cluster.nodes_manager.initialize()
            except Exception as error:  # noqa: BLE001 - best effort, see below
                # Every node known is unreachable (redis-py raises RedisClusterException,
                # not a RedisError), or the map is incomplete: keep the old addresses.
                # The caller's own error, raised next, is what it must see and retry.
                log.debug("cluster topology not refreshed: %s", error)
                return
            finally:
                self._refreshed = time.monotonic()
            with self._lock:
                pools = list(self._pools.values())
            for pool in pools:
                node = self._cluster.nodes_manager.slots_cache.get(pool.slot)
                if node:
                    pool.move_to((node[0].host, int(node[0].port)))

    def close(self) -> None:
        """Close every pool and the topology client."""
        with self._lock:
            pools = list(self._pools.values())
            self._pools.clear()
        for pool in pools:
            pool.disconnect()
        self._pool.disconnect()
        if self._cluster is not None:
            self._cluster.close()

    def __enter__(self) -> Connections:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _new_pool(self, slot: int, key: str) -> SlotPool:
        assert self._cluster is not None
        node = self._cluster.nodes_manager.slots_cache.get(slot)
        if not node:
            self.refresh(force=True)
            node = self._cluster.nodes_manager.slots_cache.get(slot)
        if not node:
            raise ConfigurationError(
                f"no master of the Redis Cluster at {self.settings.masked_url} serves slot "
                f"{slot} (of key {key!r}): the cluster does not cover every slot"
            )
        base = self._pool
        kwargs = dict(base.connection_kwargs)
        ssl = issubclass(base.connection_class, redis.SSLConnection)
        return SlotPool(
            self,
            slot,
            (node[0].host, int(node[0].port)),
            connection_class=SlotSSLConnection if ssl else SlotConnection,
            max_connections=base.max_connections,
            **kwargs,
        )


def _cluster_enabled(client: redis.Redis) -> bool | None:
    """Whether ``client``'s server runs in cluster mode; None when its user may not ask."""
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    except redis.exceptions.NoPermissionError:
        pass
    try:
        client.execute_command("CLUSTER SLOTS")
    except redis.exceptions.NoPermissionError:
        return None
    except redis.ResponseError as error:
        if "cluster support disabled" in str(error):
            return False
        raise
    return True


def _open_cluster(settings: RedisSettings, pool: redis.ConnectionPool) -> RedisCluster:
    """The topology client, with the connection options (TLS, credentials, timeouts)
    of ``pool``, the URL's node."""
    kwargs = dict(pool.connection_kwargs)
    if "path" in kwargs:
        raise ConfigurationError(
            f"Redis Cluster needs a TCP address, not a unix socket ({settings.masked_url} "
            f"from {settings.origin})"
        )
    host, port = kwargs.pop("host"), int(kwargs.pop("port"))
    kwargs.pop("db", None)
    if issubclass(pool.connection_class, redis.SSLConnection):
        kwargs["ssl"] = True
    where = settings.masked_url
    with translate_errors("reading the cluster's slots", where):
        try:
            return RedisCluster(host=host, port=port, require_full_coverage=False, **kwargs)
        except redis.exceptions.RedisClusterException as error:
            # Not a RedisError: told apart by what it wraps (unreachable, or refused).
            detail = scrub(_innermost(error), settings.url)
            if is_weather(error):
                raise RedisUnavailable(
                    f"reading the cluster's slots on {where}: {detail}"
                ) from None
            raise RedisCommandError(f"reading the cluster's slots on {where}: {detail}") from None


def _innermost(error: BaseException) -> str:
    """The message of the deepest Redis error in ``error``'s chain: what the server or
    the socket said, which redis-py's cluster errors rephrase (a missing permission
    becomes "Cluster mode is not enabled on this node")."""
    found, current, seen = str(error), error.__cause__ or error.__context__, 0
    while current is not None and seen < 16:
        if isinstance(current, redis.RedisError) and str(current):
            found = str(current)
        current, seen = current.__cause__ or current.__context__, seen + 1
    return found
