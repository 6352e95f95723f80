"""Cheap per-process health checks for container probes (``status --alive``,
``status --receipts``).

The full ``status`` answers for the whole deployment: one dead letter anywhere makes
it exit 1, and it counts workflows. A probe must answer for one process and cost a
few commands, so these read only XINFO GROUPS and XINFO CONSUMERS of the engine's
streams.

:func:`find_alive` relies on what ``status`` does (see :mod:`lifecycle.status`):
Redis resets a consumer's idle time at every XREADGROUP (blocking reads that return
nothing included) and at every claim, so a live listener's idle time stays under
``max(block_ms, claim_idle / 3)``. Every worker's default consumer name starts with
its host name (``host-pid-random``, :func:`rqse.listener.default_consumer_name`), and
a container's host name is its own, so a probe run inside the container finds the
process beside it by that prefix, and a restarted process is found by its new name
while the old one's idle time grows.

The receipts worker reads with XREAD and holds no consumer; :func:`receipts_behind`
tells whether it keeps up instead: no entry has waited for its group longer than the
threshold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from lifecycle.keys import LIFECYCLE_GROUP, RECEIPTS_GROUP, TASK_GROUP, Keys
from lifecycle.status import read_streams

__all__ = ["Alive", "find_alive", "receipts_behind"]


@dataclass(frozen=True)
class Alive:
    """The matching consumer that talked to Redis most recently."""

    consumer: str
    group: str
    stream: str
    idle_ms: int


def _streams(
    client: redis.Redis, keys: Keys, more_kinds: Iterable[str] = ()
) -> list[tuple[str, str]]:
    """(stream, engine group) for the lifecycle stream, every known kind's (the kinds
    submitted flows use) and each of ``more_kinds``."""
    members: Any = client.smembers(keys.kinds)
    kinds = sorted({k.decode("utf-8", "replace") for k in members} | set(more_kinds))
    return [(keys.lifecycle, LIFECYCLE_GROUP), *((keys.tasks(k), TASK_GROUP) for k in kinds)]


def find_alive(
    client: redis.Redis, keys: Keys, name: str, stale_s: float, kinds: Iterable[str] = ()
) -> tuple[Alive | None, Alive | None]:
    """Look for a consumer named ``name`` or ``name-...`` in any group of the engine's
    streams. Returns (the most recent one that talked to Redis within ``stale_s``, or
    None; the most recent one found at all, or None when there is none).

    A kind enters ``{flow}:kinds`` when a flow using it is submitted, not when a worker
    of it starts: a task worker's probe names its kind (``kinds``) so that it is found
    before the first such workflow."""
    best: Alive | None = None
    for stream, _group in _streams(client, keys, kinds):
        try:
            groups: Any = client.xinfo_groups(stream)
        except redis.ResponseError:  # no such stream yet: nothing reads it
            continue
        for raw in groups:
            group = _text(raw["name"])
            if group == RECEIPTS_GROUP:  # XREAD: no consumers
                continue
            consumers: Any = client.xinfo_consumers(stream, group)
            for consumer in consumers:
                found = _text(consumer["name"])
                if found != name and not found.startswith(f"{name}-"):
                    continue
                idle = int(consumer.get("idle", 0))
                if best is None or idle < best.idle_ms:
                    best = Alive(found, group, stream, idle)
    if best is not None and best.idle_ms < stale_s * 1000:
        return best, best
    return None, best


def receipts_behind(client: redis.Redis, keys: Keys, stale_s: float) -> list[str]:
    """Each engine stream whose oldest entry not yet archived by the receipts group is
    older than ``stale_s``, as ``"<stream>: N entries, the oldest T ms old"``; a stream
    without a receipts group is named too (``no receipts group``), but only the
    lifecycle stream must have one: the receipts worker creates the task streams'
    groups as kinds appear."""
    behind = []
    for info in read_streams(client, keys):
        stream = info.stream
        receipts = next((g for g in info.others if g.name == RECEIPTS_GROUP), None)
        if receipts is None:
            if stream == keys.lifecycle:
                behind.append(f"{stream}: no receipts group (has the receipts worker started?)")
            continue
        age = receipts.oldest_waiting_ms
        if age is not None and age >= stale_s * 1000:
            behind.append(f"{stream}: {receipts.lag} entries not archived, the oldest {age} ms old")
    return behind


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
