"""A deployment as a program reaches it: its partitions and a Redis client for each.

The command line, the HTTP API and the benchmarks find a workflow's partition and
client here (:meth:`Deployment.for_workflow`), or walk every partition
(:meth:`Deployment.each_partition`); with one partition both give the one client
and ``{flow}``'s keys.
"""

from __future__ import annotations

from typing import Any

import redis

from flowlang.graph import Graph
from flowlang.limits import DEFAULT_LIMITS, Limits
from lifecycle.client import Client
from lifecycle.keys import Keys
from lifecycle.partitions import Partitions, check_unchanged, stored_partitions
from lifecycle.submit import new_workflow_id
from rqse.cluster import Connections

__all__ = ["Deployment"]


class Deployment:
    """The partitions under ``base`` reached through ``connections``; clients are made
    (and checked with PING) on first use, one per partition."""

    def __init__(self, connections: Connections, base: str = "{flow}", count: int | None = None):
        """``count``: the partition count the caller was told (``--partitions``), checked
        against the stored one when first needed; None: whatever is stored."""
        self.connections = connections
        self.base = base
        self._count = count
        self._clients: dict[str, redis.Redis] = {}
        self._partitions: Partitions | None = None

    @property
    def home(self) -> Keys:
        """The base prefix's keys: the only partition's when there is one."""
        return Keys(self.base)

    @property
    def client(self) -> redis.Redis:
        """A client for the base prefix's keys (the partitions' shared keys)."""
        return self.client_for(self.home)

    def client_for(self, keys: Keys) -> redis.Redis:
        """A client for the keys of one partition (checked with PING on first use)."""
        client = self._clients.get(keys.prefix)
        if client is None:
            client = self.connections.client_for(keys.prefix)
            client.ping()  # fail here, with the URL, rather than inside a command
            self._clients[keys.prefix] = client
        return client

    @property
    def partitions(self) -> Partitions:
        """The deployment's partitions: the stored count, checked against the one given."""
        if self._partitions is None:
            self._partitions = stored_partitions(self.client, self.base, self._count)
        return self._partitions

    def for_workflow(self, workflow_id: str) -> tuple[redis.Redis, Keys]:
        """The client and keys of the partition that holds ``workflow_id``."""
        keys = self.partitions.keys_for(workflow_id)
        return self.client_for(keys), keys

    def for_tag(self, tag: str) -> tuple[redis.Redis, Keys]:
        """The client and keys of the partition of the runs tagged ``tag`` (a schedule)."""
        keys = self.partitions.keys(self.partitions.index_of_tag(tag))
        return self.client_for(keys), keys

    def each_partition(self) -> list[tuple[redis.Redis, Keys]]:
        """Every partition's client and keys, by index."""
        return [(self.client_for(keys), keys) for keys in self.partitions.all]

    def outcomes(self) -> dict[str, int]:
        """How many workflows ended, by status, in every partition together
        (``Keys.outcomes``)."""
        total: dict[str, int] = {}
        for client, keys in self.each_partition():
            counts: dict[bytes, bytes] = client.hgetall(keys.outcomes)  # type: ignore[assignment]
            for status, count in counts.items():
                name = status.decode()
                total[name] = total.get(name, 0) + int(count)
        return total

    def submit(
        self,
        graph: Graph,
        input: Any = None,
        workflow_id: str | None = None,
        limits: Limits = DEFAULT_LIMITS,
        *,
        priority: int = 0,
        concurrency_key: str | None = None,
        max_running: int | None = None,
    ) -> str:
        """:meth:`lifecycle.client.Client.submit` in the workflow's partition: an id is
        chosen here when none is given (in the concurrency key's partition, if any); a
        given one under a concurrency key must live in the key's partition
        (:class:`~lifecycle.errors.LifecycleError` otherwise)."""
        partitions = self.partitions
        if workflow_id is None:
            workflow_id = partitions.place(new_workflow_id(graph), concurrency_key)
        else:
            partitions.check_placed(workflow_id, concurrency_key)
        submitted = self.workflow_client(workflow_id).submit(
            graph,
            input,
            workflow_id,
            limits,
            priority=priority,
            concurrency_key=concurrency_key,
            max_running=max_running,
        )
        check_unchanged(self.client, partitions)
        return submitted

    def workflow_client(self, workflow_id: str) -> Client:
        """The operator's :class:`~lifecycle.client.Client` on the workflow's partition:
        its status, controls, waits."""
        return Client(*self.for_workflow(workflow_id))

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self.connections.close()
