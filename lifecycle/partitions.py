"""Partitions: how a deployment divides its workflows so that several Redis masters
(a Redis Cluster) can carry them, each atomic step staying on one node.

A deployment has P partitions, fixed when it is created. Partition ``i`` is a whole
engine under its own hash tag (:class:`~lifecycle.keys.Keys` with that prefix): its
lifecycle stream, its task streams, its workflows, timers and schedules. A workflow
belongs to one partition, chosen from its id alone (:meth:`Partitions.index_of`), so
anyone holding an id finds its keys without a lookup. With P = 1 the single
partition is the base prefix itself, ``{flow}``: today's key layout, unchanged.

What the partitions share lives under the base prefix (the *home* keys): the stored
count P and the task kinds' concurrency limits, whose slots must be counted once for
every partition.

Tags are chosen for the slot they map to: partition ``i`` of P gets the first tag
``{<base>:<i>:<n>}`` whose slot lies in the i-th of P equal slot ranges. A cluster
made with ``redis-cli --cluster create`` splits the 16,384 slots into equal
contiguous ranges per master, so P partitions on M masters (P a multiple of M)
give each master P / M of them.

An id's partition is a hash (BLAKE2b, 64 bits) of its *routing part* modulo P;
the routing part is what stands between the first ``{`` and the next ``}`` when
that is not empty, else the whole id: the convention of Redis hash tags. Runs
that must share a partition (a schedule's runs with their schedule, the runs of
one concurrency key) carry the same ``{...}`` in their ids.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import redis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from lifecycle.errors import LifecycleError
from lifecycle.keys import Keys

__all__ = [
    "MAX_PARTITIONS",
    "CountWatch",
    "PartitionMismatch",
    "archive_root",
    "archived_partitions",
    "check_unchanged",
    "Partitions",
    "partition_tag",
    "routing_part",
    "stored_partitions",
]

log = logging.getLogger(__name__)

# Enough for a cluster of hundreds of masters; every process holds a stream reader
# per partition, so the count is bounded.
MAX_PARTITIONS = 1024


class PartitionMismatch(LifecycleError):
    """Raised when a process is started with a partition count other than the stored one."""


def routing_part(workflow_id: str) -> str:
    """The part of an id that chooses its partition: a non-empty ``{...}``, else all."""
    start = workflow_id.find("{")
    if start >= 0:
        end = workflow_id.find("}", start + 1)
        if end > start + 1:
            return workflow_id[start + 1 : end]
    return workflow_id


def _tag_content(base: str) -> tuple[str, str, str]:
    """(text before the tag, the tag's content, text after) of a prefix like ``{flow}``."""
    start = base.find("{")
    end = base.find("}", start + 1) if start >= 0 else -1
    if start < 0 or end <= start + 1:
        raise LifecycleError(
            f"--prefix {base!r}: partitions need a hash tag in the prefix, e.g. {{flow}}"
        )
    return base[:start], base[start + 1 : end], base[end + 1 :]


def partition_tag(base: str, index: int, count: int) -> str:
    """The prefix of partition ``index`` of ``count``: ``base`` itself when ``count`` is 1,
    else ``base`` with its tag made ``{<tag>:<index>:<n>}``, n the smallest whose slot lies
    in the index-th of ``count`` equal slot ranges."""
    if count == 1:
        return base
    before, tag, after = _tag_content(base)
    low = index * REDIS_CLUSTER_HASH_SLOTS // count
    high = (index + 1) * REDIS_CLUSTER_HASH_SLOTS // count
    n = 0
    while True:
        candidate = f"{tag}:{index}:{n}"
        if low <= key_slot(candidate.encode()) < high:
            return f"{before}{{{candidate}}}{after}"
        n += 1


@dataclass(frozen=True)
class Partitions:
    """The P partitions of a deployment under the base prefix ``base``."""

    base: str = "{flow}"
    count: int = 1
    #: False when no count was stored and this is the default (1): see CountWatch.
    stored: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_PARTITIONS:
            raise LifecycleError(f"--partitions {self.count}: expected 1 to {MAX_PARTITIONS:,}")
        if self.count > 1:
            _tag_content(self.base)

    @cached_property
    def all(self) -> tuple[Keys, ...]:
        """Every partition's keys, by index."""
        if self.count == 1:
            return (Keys(self.base),)  # the base prefix is the partition: nothing apart
        return tuple(
            Keys(partition_tag(self.base, index, self.count), home=self.base)
            for index in range(self.count)
        )

    @property
    def home(self) -> Keys:
        """The keys the partitions share (the stored count, the kind limits)."""
        return Keys(self.base)

    def keys(self, index: int) -> Keys:
        return self.all[index]

    def index_of(self, workflow_id: str) -> int:
        """The partition a workflow id belongs to."""
        if self.count == 1:
            return 0
        digest = hashlib.blake2b(routing_part(workflow_id).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.count

    def group(self, workflow_ids: Iterable[str]) -> dict[int, list[str]]:
        """``workflow_ids`` by the partition each belongs to, in their order."""
        grouped: dict[int, list[str]] = {}
        for workflow_id in workflow_ids:
            grouped.setdefault(self.index_of(workflow_id), []).append(workflow_id)
        return grouped

    def keys_for(self, workflow_id: str) -> Keys:
        """The keys of the partition that holds ``workflow_id``."""
        return self.all[self.index_of(workflow_id)]

    def place(self, generated_id: str, concurrency_key: str | None) -> str:
        """The id a new workflow gets from ``generated_id``: tagged to live in its
        concurrency key's partition (whose gate counts the key's runs), if it has one."""
        if concurrency_key is None:
            return generated_id
        return self.tagged_id(generated_id, concurrency_key)

    def check_placed(self, workflow_id: str, concurrency_key: str | None) -> None:
        """Refuse an id given for a workflow under a concurrency key that does not live in
        the key's partition (one gate per key, on one partition, counts its runs)."""
        if concurrency_key is None or self.count == 1:
            return
        if self.index_of(workflow_id) != self.index_of_tag(concurrency_key):
            raise LifecycleError(
                f"workflow id {workflow_id!r}: a workflow under concurrency key "
                f"{concurrency_key!r} lives in that key's partition; put "
                f"{{{concurrency_key}}} in the id (or let the id be chosen)"
            )

    def archive(self, root: str | Path, index: int) -> Path:
        """Where partition ``index`` is archived under the receipts directory ``root``:
        ``root`` itself with one partition, ``root/partition-<index>`` with several (each
        partition has its own receipts worker, chain and segments)."""
        return Path(root) if self.count == 1 else Path(root) / f"partition-{index}"

    def index_of_tag(self, tag: str) -> int:
        """The partition of the runs tagged ``tag`` (a schedule's name, a concurrency key)."""
        return self.index_of(f"{{{tag}}}")

    def tagged_id(self, workflow_id: str, tag: str) -> str:
        """``workflow_id`` made to live in ``tag``'s partition: unchanged when it does
        already, else ``{tag}`` put before it (how a generated id joins the partition of
        its schedule or concurrency key)."""
        home = self.index_of_tag(tag)
        if self.index_of(workflow_id) == home:
            return workflow_id
        tagged = f"{{{tag}}}{workflow_id}"
        if self.index_of(tagged) != home:
            raise LifecycleError(f"{tag!r} cannot be a routing tag: it holds a '}}'")
        return tagged


_ARCHIVE_FOLDER = re.compile(r"partition-(\d+)")


def archived_partitions(root: str | Path, base: str, count: int | None = None) -> Partitions:
    """The partitions of the deployment an archive directory belongs to: ``count`` when
    known (``--partitions``, the stored count), else from its ``partition-<i>`` folders
    (one past the highest; none: one partition, the directory itself). Several receipts
    workers may each archive some partitions (``--partition``): a folder may be missing."""
    if count is None:
        found = [
            int(match.group(1))
            for path in Path(root).iterdir()
            if path.is_dir() and (match := _ARCHIVE_FOLDER.fullmatch(path.name))
        ]
        count = max(found, default=0) + 1
    return Partitions(base, count)


def archive_root(path: str) -> str:
    """The receipts directory a partition's archive folder is in (``path`` itself when it
    is no partition's folder)."""
    folder = Path(path)
    return str(folder.parent) if _ARCHIVE_FOLDER.fullmatch(folder.name) else path


def check_unchanged(client: redis.Redis, partitions: Partitions) -> None:
    """After writing with the default of one partition (none was stored): refuse if a
    lifecycle worker stored another count meanwhile (what was written sits where no
    worker reads it)."""
    if partitions.stored:
        return
    raw = client.get(Keys(partitions.base).partitions)
    if raw is not None and int(raw) != partitions.count:
        raise PartitionMismatch(
            f"the deployment was set up for {int(raw)} partitions while this was written "
            f"for {partitions.count}: nothing will read it; send it again"
        )


def stored_partitions(
    client: redis.Redis, base: str, count: int | None, *, create: bool = False
) -> Partitions:
    """The deployment's partitions as stored under ``base``; ``count`` (from
    ``--partitions``), when given, must equal the stored count. ``create``: store
    ``count`` when none is stored yet (a lifecycle worker, the first to start)."""
    if count is not None:
        Partitions(base, count)  # a count out of range, or no hash tag: said first
    key = Keys(base).partitions
    try:
        raw = client.get(key)
    except redis.exceptions.NoPermissionError as error:
        # An ACL user of a deployment older than partitions: it has one.
        log.warning("cannot read %s (%s): running with one partition", key, error)
        return Partitions(base, 1)
    if raw is None and create and count is not None:
        home = Keys(base)
        if count > 1 and client.exists(home.lifecycle, home.workflows):
            # A deployment of one partition in use: partitions would strand its work.
            raise PartitionMismatch(
                f"--partitions {count}: this Redis holds a deployment of one partition under "
                f"{base} ({home.lifecycle} exists); the count is fixed when a deployment is "
                "created: keep one partition, or give the new deployment its own --prefix"
            )
        # NX: of two workers started together with different counts, one wins and the
        # other is refused below, rather than both believing their own.
        client.set(key, count, nx=True)
        raw = client.get(key)
    stored = int(raw) if raw is not None else 1
    if count is not None and count != stored:
        told = f"is set up for {stored} partition{'s' if stored != 1 else ''}"
        if raw is None:
            told = "has no partitions stored yet (start a lifecycle worker with --partitions)"
        raise PartitionMismatch(
            f"--partitions {count}: this deployment {told} ({key}); the count is fixed "
            "when a deployment is created"
        )
    return Partitions(base, stored, stored=raw is not None)


class CountWatch:
    """Watches the stored partition count while a process runs with ``in_use``
    partitions that it read when none was stored: the first lifecycle worker of a new
    deployment may store P > 1 a moment after its peers started. On a change,
    ``on_change(message)`` is called once (the process stops and, restarted by its
    supervisor, runs with the stored count)."""

    def __init__(
        self,
        client: redis.Redis,
        base: str,
        in_use: int,
        on_change: Callable[[str], None],
        interval: float = 1.0,
    ) -> None:
        self._client, self._key, self._in_use = client, Keys(base).partitions, in_use
        self._on_change, self._interval = on_change, interval
        self._stop = threading.Event()
        self.changed: str | None = None
        self._thread = threading.Thread(target=self._run, name="partition-count", daemon=True)

    def start(self) -> CountWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                raw = self._client.get(self._key)
            except redis.RedisError:
                continue  # Redis weather: the process's own listeners say so
            if raw is not None and int(raw) != self._in_use:
                self.changed = (
                    f"the deployment was set up for {int(raw)} partitions ({self._key}) after "
                    f"this process started with {self._in_use}: stopping, to be started again"
                )
                self._on_change(self.changed)
                return
