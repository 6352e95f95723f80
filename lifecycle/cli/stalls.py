"""Why a followed workflow does not move: the warnings ``run --wait`` prints while it waits.

Most mistakes in a first deployment do not fail, they wait: no lifecycle worker
reads the start-workflow, or no task worker serves a kind. :class:`StallWatch`
looks at the consumer groups once a second and, after ``after`` seconds of no
progress, says which of the two it is — once each — while the wait goes on.

A group counts as served when one of its consumers touched it within ``after``
seconds (XINFO CONSUMERS ``idle``: a listener blocked on a read resets it every
second or so, a dead one lets it grow).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis

from flowlang.graph import Graph
from flowlang.machine import parse_key
from lifecycle import records as rec
from lifecycle.keys import LIFECYCLE_GROUP, TASK_GROUP, Keys, task_kind

__all__ = ["DEFAULT_WARN_AFTER", "StallWatch"]

log = logging.getLogger(__name__)

_STARTED = rec.START_PREFIX.encode()
_ENDED = rec.END_PREFIX.encode()

DEFAULT_WARN_AFTER = 10.0  # seconds without progress before a warning
CHECK_EVERY = 1.0  # seconds between looks at the groups (a few XINFO calls each)


class StallWatch:
    """Warnings, each given once, about what keeps ``workflow_id`` from moving.

    :meth:`check` takes the workflow hash's field names (what the waiter reads
    anyway) and returns the new warning lines; it looks at Redis at most once per
    :data:`CHECK_EVERY` seconds. ``after`` <= 0 turns the warnings off.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        graph: Graph,
        after: float = DEFAULT_WARN_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.keys = keys
        self.after = after
        self.clock = clock
        self.started = clock()
        self._next_check = self.started + min(after, CHECK_EVERY)
        self._kinds = [task_kind(n.name or "", str(n.kind)) for n in graph.nodes]
        self._open_since: dict[str, float] = {}  # task instance key -> when first seen open
        self._given: set[str] = set()  # what was warned about (a kind, or the lifecycle)

    def check(self, field_names: Iterable[bytes]) -> list[str]:
        if self.after <= 0:
            return []
        now = self.clock()
        open_kinds = self._open_kinds(field_names, now)
        if now < self._next_check:
            return []
        self._next_check = now + CHECK_EVERY
        try:
            return self._warnings(open_kinds, now)
        except redis.exceptions.NoPermissionError:
            # A submitter's ACL (docs/security.md) need not grant XINFO: no warnings then.
            log.debug("no permission to look at the consumer groups", exc_info=True)
            self.after = 0
            return []

    def _warnings(self, open_kinds: dict[str, float] | None, now: float) -> list[str]:
        warnings = []
        if open_kinds is None:  # no record yet: the start-workflow waits for the lifecycle
            if now - self.started >= self.after and "" not in self._given:
                line = self._lifecycle_warning()
                if line:
                    self._given.add("")
                    warnings.append(line)
            return warnings
        for kind, since in sorted(open_kinds.items()):
            if now - since >= self.after and kind not in self._given:
                line = self._kind_warning(kind)
                if line:
                    self._given.add(kind)
                    warnings.append(line)
        return warnings

    def _open_kinds(self, field_names: Iterable[bytes], now: float) -> dict[str, float] | None:
        """Each kind with a started, unended task instance -> since when the oldest has
        been seen open; None when the workflow has no record yet."""
        started, ended = set(), set()
        any_field = False
        for name in field_names:
            any_field = True
            if name.startswith(_STARTED):
                started.add(name[len(_STARTED) :].decode(errors="replace"))
            elif name.startswith(_ENDED):
                ended.add(name[len(_ENDED) :].decode(errors="replace"))
        if not any_field:
            return None
        open_keys = started - ended
        for key in list(self._open_since):
            if key not in open_keys:
                del self._open_since[key]
        kinds: dict[str, float] = {}
        for key in open_keys:
            since = self._open_since.setdefault(key, now)
            try:
                kind = self._kinds[parse_key(key)[0]]
            except (ValueError, IndexError):
                continue  # not a key this graph made: inspect reports it
            kinds[kind] = min(since, kinds.get(kind, since))
        return kinds

    def _unserved(self, stream: str, group: str, held: bool = False) -> int | None:
        """How many entries of ``stream`` wait for ``group`` when nobody serves it (no
        group, or entries waiting and no consumer that touched the group within
        ``after`` s); None when it is served. Entries delivered and pending count as
        waiting only when ``held``: a task worker holds one for as long as the task
        runs, reading nothing meanwhile, while a lifecycle worker that holds events
        for seconds without reading is gone."""
        try:
            groups: Any = self.client.xinfo_groups(stream)
        except redis.exceptions.NoPermissionError:
            raise  # a refusal says nothing about the stream: see check()
        except redis.ResponseError:  # no such stream
            return 0
        found = next((g for g in groups if _text(g.get("name")) == group), None)
        if found is None:
            length: Any = self.client.xlen(stream)
            return int(length)
        lag = found.get("lag")
        if not isinstance(lag, int):  # Redis cannot tell after deletions: count (up to 1000)
            after_last = "(" + _text(found.get("last-delivered-id"))
            lag = len(self.client.xrange(stream, after_last, "+", count=1000))  # type: ignore[arg-type]
        if held:
            lag += int(found.get("pending") or 0)
        if not lag:
            return None
        consumers: Any = self.client.xinfo_consumers(stream, group)
        limit = self.after * 1000
        if any(int(c.get("idle", limit)) < limit for c in consumers):
            return None
        return int(lag)

    def _lifecycle_warning(self) -> str | None:
        if self._unserved(self.keys.lifecycle, LIFECYCLE_GROUP, held=True) is None:
            return None
        return (
            f"still waiting: no lifecycle worker has read {self.keys.lifecycle} "
            "(start one: python -m lifecycle worker)"
        )

    def _kind_warning(self, kind: str) -> str | None:
        waiting = self._unserved(self.keys.tasks(kind), TASK_GROUP)
        if waiting is None:
            return None
        tasks = "task" if waiting == 1 else "tasks"
        return (
            f"still waiting: no worker serves kind {kind} ({waiting} {tasks} waiting on "
            f"{self.keys.tasks(kind)}; see python -m workers --help)"
        )


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
