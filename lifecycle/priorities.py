"""Workflow priorities: their bounds, and every task stream they add.

A workflow's priority (an integer, :data:`MIN_PRIORITY`..:data:`MAX_PRIORITY`, 0 by
default) is chosen at submission, stored on its record and carried by each of its
start-tasks. Priority 0 uses the kind's stream ``{flow}:tasks:<kind>`` as it always
has; any other priority has its own, ``{flow}:tasks:<kind>:p<N>``, registered in
``{flow}:priorities`` by the submission (as ``{flow}:kinds`` registers the kinds).
A kind's workers read all of its streams in one XREADGROUP, highest priority first
(:func:`stream_order`): each read takes up to a batch from every stream and runs
the higher ones first, so a new high-priority task waits at most one batch and
lower ones still move every batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis

from lifecycle.errors import LifecycleError
from lifecycle.keys import Keys

__all__ = [
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "BadPriority",
    "TaskStream",
    "check_priority",
    "kind_streams",
    "priority_member",
    "priority_streams",
    "stream_kind",
    "stream_order",
    "stream_priority",
    "task_streams",
]

log = logging.getLogger(__name__)

# One stream per priority and kind: a small range keeps a worker's read short.
MIN_PRIORITY, MAX_PRIORITY = -9, 9


class BadPriority(LifecycleError):
    """Raised when a priority is not an integer within MIN_PRIORITY..MAX_PRIORITY."""


def check_priority(value: Any, where: str = "priority") -> int:
    """``value`` if it is an integer within the bounds; else :class:`BadPriority`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadPriority(f"{where}: {value!r} is not an integer")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise BadPriority(
            f"{where}: {value} is out of range (expected {MIN_PRIORITY}..{MAX_PRIORITY})"
        )
    return value


def priority_member(kind: str, priority: int) -> str:
    """The ``{flow}:priorities`` member of one kind's stream of ``priority``."""
    return f"{kind}:{priority}"


@dataclass(frozen=True, slots=True)
class TaskStream:
    """One stream of start-tasks: its kind, its priority and its name."""

    kind: str
    priority: int
    stream: str

    @property
    def source(self) -> str:
        """How tools name it: the kind, and ``<kind>:p<N>`` for a priority's own."""
        return f"{self.kind}:p{self.priority}" if self.priority else self.kind


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _parse_member(member: str) -> tuple[str, int] | None:
    kind, colon, number = member.rpartition(":")
    try:
        priority = int(number)
    except ValueError:
        return None
    if not colon or not kind or priority == 0:
        return None
    return kind, priority


def priority_streams(keys: Keys, members: Iterable[Any]) -> list[str]:
    """The streams named by ``{flow}:priorities`` members (str or bytes); members that
    name none are left out."""
    parsed = (_parse_member(_text(member)) for member in members)
    return [keys.tasks(*found) for found in parsed if found is not None]


def task_streams(client: Any, keys: Keys, kinds: Iterable[str] | None = None) -> list[TaskStream]:
    """Every task stream, by kind (sorted), highest priority first within a kind: those of
    ``{flow}:kinds`` (priority 0) and of ``{flow}:priorities``. ``kinds``: only these
    (whether registered or not; ``{flow}:kinds`` is then not read). One round trip.

    A user not allowed to read ``{flow}:priorities`` (an ACL from before priorities)
    gets the kinds' own streams, said once per process at WARNING."""
    wanted = None if kinds is None else sorted(set(kinds))
    pipe = client.pipeline(transaction=False)
    if wanted is None:
        pipe.smembers(keys.kinds)
    pipe.smembers(keys.priorities)
    replies = pipe.execute(raise_on_error=False)
    members = replies[-1]
    if isinstance(members, redis.exceptions.NoPermissionError):
        _refused(keys.priorities, members)
        members = set()
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    streams = {(_text(k), 0) for k in (replies[0] if wanted is None else wanted)}
    for member in members:
        parsed = _parse_member(_text(member))
        if parsed is not None and (wanted is None or parsed[0] in wanted):
            streams.add(parsed)
    found = sorted(streams, key=lambda kp: (kp[0], -kp[1]))
    return [TaskStream(kind, priority, keys.tasks(kind, priority)) for kind, priority in found]


_said: set[str] = set()


def _refused(key: str, error: Exception) -> None:
    if key not in _said:
        _said.add(key)
        log.warning("%s not readable (%s): its priority streams are not followed", key, error)


def kind_streams(client: Any, keys: Keys, kind: str) -> list[str]:
    """The streams a worker of ``kind`` reads: priority 0's and every registered other."""
    return [found.stream for found in task_streams(client, keys, [kind])]


def stream_priority(keys: Keys, stream: str) -> int | None:
    """The priority of a task stream of ``keys`` (0 for a kind's own), None for any other
    stream. Unambiguous, as a kind never holds a ``:``."""
    head = keys.tasks("")
    if not stream.startswith(head):
        return None
    kind, colon, rest = stream[len(head) :].partition(":")
    if not colon:
        return 0 if kind else None
    if not rest.startswith("p"):
        return None
    try:
        return int(rest[1:])
    except ValueError:
        return None


def stream_kind(keys: Keys, stream: str) -> str:
    """The kind of a task stream of ``keys`` (its own or one of its priorities')."""
    return stream[len(keys.tasks("")) :].partition(":")[0]


def stream_order(keys: Keys) -> Callable[[str], int]:
    """Sort key of task streams for :class:`rqse.EventListener` (``order``): the highest
    priority first (whatever the kind), any stream not a task stream last."""

    def order(stream: str) -> int:
        priority = stream_priority(keys, stream)
        return MAX_PRIORITY + 1 if priority is None else -priority

    return order
