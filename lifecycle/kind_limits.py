"""Concurrency limits per task kind: at most N tasks of a kind run at once, across all
workers (``python -m lifecycle limit set KIND N``).

A slot is a lease: a member ``<name> <consumer>`` (:func:`slot_name`) of
``{flow}:slots:<kind>`` scored by when it expires (Redis's clock). A worker takes the
slots of a batch's tasks in one call (:meth:`KindSlots.take`), renews them while they
run and releases them in the transaction that sends the batch's answers; a holder that
dies frees its slot when the lease lapses, so a kind limited to 1 is never blocked for longer
than a lease by a dead worker. Tasks without a slot wait in line
(``{flow}:slot-queue:<kind>``, by stream entry id), each blocked on its own wake-up
list: a release, a raised or removed limit wakes the first in line, and a waiter looks
again at the latest when the earliest holder's lease ends or its own needs renewing
(no polling in between). Every step is one call of ``scripts/kind_slots.lua``.

Workers read the limit with each batch of start-tasks (one HGET in the read's round
trip), so a kind without a limit costs nothing more and a change takes effect at the
next batch, without a restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from lifecycle.errors import LifecycleError
from lifecycle.keys import Keys
from rqse import lua
from rqse.fastpipe import execute

__all__ = [
    "BadKindLimit",
    "KindLimit",
    "KindSlots",
    "GaveUp",
    "list_kind_limits",
    "remove_kind_limit",
    "set_kind_limit",
    "slot_name",
]

log = logging.getLogger(__name__)

_SCRIPTS = lua.scripts_dir(__file__)
SCRIPT = "kind_slots"
MAX_LIMIT = 1_000_000  # tasks of one kind at once; past it Lua's numbers lose integers
DEFAULT_LEASE = 30.0  # seconds a slot outlives its holder's last renewal
DEFAULT_CHECK_INTERVAL = 5.0  # longest a waiter blocks before it looks at cancellation
# Seconds a limit read from another node is reused (several partitions): a limit set or
# removed reaches the workers of other partitions within this.
LIMIT_READ_REUSE = 1.0


class BadKindLimit(LifecycleError):
    """Raised when a kind or a limit given to ``limit set``/``remove`` is not valid."""


@dataclass(frozen=True, slots=True)
class KindLimit:
    """A kind's limit and how it stands now: slots held, tasks waiting."""

    kind: str
    limit: int
    running: int
    waiting: int

    def summary(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "limit": self.limit,
            "running": self.running,
            "waiting": self.waiting,
        }


def _check_kind(kind: str) -> str:
    if not kind or any(c.isspace() for c in kind) or ":" in kind:
        raise BadKindLimit(
            f"kind {kind!r}: expected a task kind (a task name's prefix before ':', "
            "no spaces), e.g. 'ml' for tasks named ml:train"
        )
    return kind


def _call(client: redis.Redis, keys: Keys, kind: str, *args: Any) -> Any:
    script = lua.load_script(client, SCRIPT, _SCRIPTS)
    return script(keys=_script_keys(keys, kind), args=_script_args(keys, kind, *args))


_KEYS = 4  # the script's KEYS


def _script_keys(keys: Keys, kind: str) -> list[str]:
    return [
        keys.slots(kind),
        keys.slot_queue(kind),
        keys.slot_waiting(kind),
        keys.slot_batches(kind),
    ]


def _script_args(
    keys: Keys, kind: str, op: str, member: str = "", order: int = 0, lease: float = 0
) -> list[Any]:
    ms = max(1, int(lease * 1000))
    return [op, kind, member, order, ms, keys.slot_wake(kind), keys.kind_limits]


def set_kind_limit(
    client: redis.Redis, keys: Keys, kind: str, limit: int, lease: float = DEFAULT_LEASE
) -> None:
    """At most ``limit`` (1 or more) tasks of ``kind`` run at once from now on; waiters
    a raised limit lets in are woken."""
    _check_kind(kind)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise BadKindLimit(
            f"limit of kind {kind!r}: {limit!r}, expected a whole number from 1 to {MAX_LIMIT:,}"
        )
    _call(client, keys, kind, "set", str(limit), 0, lease)


def remove_kind_limit(
    client: redis.Redis, keys: Keys, kind: str, lease: float = DEFAULT_LEASE
) -> bool:
    """Lift ``kind``'s limit (every waiter is woken and runs); False when it had none."""
    _check_kind(kind)
    had = client.hexists(keys.kind_limits, kind)
    _call(client, keys, kind, "remove", "", 0, lease)
    return bool(had)


def list_kind_limits(client: redis.Redis, keys: Keys) -> list[KindLimit]:
    """Every kind with a limit, by name, with its slots held and tasks waiting (leases
    that lapsed not counted)."""
    limits = {
        (k.decode() if isinstance(k, bytes) else str(k)): int(v)
        for k, v in client.hgetall(keys.kind_limits).items()
    }
    kinds = sorted(limits)
    if not kinds:
        return []
    (now_s, now_us) = client.time()
    now = now_s * 1000 + now_us // 1000
    pipe = client.pipeline(transaction=False)
    for kind in kinds:
        pipe.zrangebyscore(keys.slots(kind), f"({now}", "+inf")
        pipe.zrange(keys.slot_batches(kind), 0, -1, withscores=True)
        pipe.zcount(keys.slot_waiting(kind), f"({now}", "+inf")
    replies = pipe.execute()
    found = []
    for i, kind in enumerate(kinds):
        holders, batches, waiting = replies[3 * i : 3 * i + 3]
        counts = dict(batches)
        running = sum(int(counts.get(holder, 1)) for holder in holders)
        found.append(KindLimit(kind, limits[kind], running, int(waiting)))
    return found


def entry_order(entry_id: str) -> int:
    """A stream entry id's place in line: its millisecond; entries of one millisecond
    go by their names (:func:`slot_name`), which sort as the stream does."""
    ms, _, _ = entry_id.partition("-")
    try:
        return int(ms)
    except ValueError:
        return 0


def slot_name(entry_id: str) -> str:
    """A task's name among the slots: its stream entry id, the sequence zero-padded so
    that names of one millisecond sort in stream order (``…-999`` before ``…-1000``).
    kind_slots.lua names a batch's tasks the same way."""
    ms, dash, seq = entry_id.partition("-")
    return f"{ms}{dash}{seq:0>20}"


class GaveUp(Exception):
    """A task waiting for a slot stopped waiting (cancelled, stopping): its ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Renewer:
    """One daemon thread per :class:`KindSlots` that renews every slot held, each third
    of a lease: a thread per task would cost its start and stop on every task, and most
    tasks end long before their first renewal is due."""

    def __init__(self, slots: KindSlots) -> None:
        self._slots = slots
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, *members: str) -> None:
        with self._lock:
            self._held.update(members)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"slots of {self._slots.kind}", daemon=True
                )
                self._thread.start()

    def drop(self, members: Iterable[str]) -> None:
        with self._lock:
            self._held.difference_update(members)

    def _run(self) -> None:
        interval = self._slots.lease / 3
        while True:
            time.sleep(interval)
            with self._lock:
                held = list(self._held)
            for member in held:
                self._renew(member)

    def _renew(self, member: str) -> None:
        try:
            renewed = self._slots.call("renew", member)
        except redis.RedisError as error:
            log.debug("slot %s: renewal failed: %s", member, error)
            return
        with self._lock:
            if renewed or member not in self._held:  # (released meanwhile: no news)
                return
            self._held.discard(member)
        log.warning(
            "slot %s of kind %s: lease lapsed before renewal (another task may have its place)",
            member,
            self._slots.kind,
        )


class KindSlots:
    """A worker's side of its kind's limit: the limit as read with each batch
    (:attr:`along`), waiting for and holding slots."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        kind: str,
        consumer: str,
        lease: float = DEFAULT_LEASE,
        check_interval: float = DEFAULT_CHECK_INTERVAL,
        home: redis.Redis | None = None,
    ) -> None:
        """``client`` serves the worker's partition; ``home`` the partitions' shared keys
        when they live elsewhere (several partitions: :attr:`apart`)."""
        #: The slots live on another node than the answers: the limit is not read with
        #: the batch, nor the release sent in the answer's transaction (sent right after).
        self.apart = home is not None and bool(keys.home)
        self._client = home if home is not None and self.apart else client
        self._limit_read: tuple[float, Any] = (-LIMIT_READ_REUSE, None)
        self.keys = keys
        self.kind = kind
        self.consumer = consumer
        self.lease = lease
        self.check_interval = check_interval
        self._script = lua.load_script(self._client, SCRIPT, _SCRIPTS)
        self.renewer = _Renewer(self)
        #: For the listener's ``read_along``: the kind's limit (None: no limit).
        self.along = ("HGET", keys.kind_limits, kind)
        #: False once Redis refused to tell the limit (ACL): nothing is asked any more.
        self.checking = True
        # EVAL rather than EVALSHA: it goes inside the answers' MULTI, where a NOSCRIPT
        # (a restarted Redis) could not be retried. Once per batch, its text is cheap.
        self._source = lua.script_source(SCRIPT, _SCRIPTS)
        self._release_head = (
            "EVAL",
            self._source,
            _KEYS,
            *_script_keys(keys, kind),
            "release",
            kind,
        )
        self._release_tail = _script_args(keys, kind, "release", "", 0, lease)[3:]
        self._holder = " " + consumer
        self._take_args = (
            *_script_keys(keys, kind),
            *_script_args(keys, kind, "take", self._holder, 0, lease),
        )
        self._take_count = len(self._take_args) - 4  # ARGV[4]: the batch's size

    def limited(self, along: Any) -> bool:
        """Whether the kind has a limit: from the reply to :attr:`along` sent with the
        read, or asked now when there was none (claimed entries). A user not allowed to
        read the limits is said once, then runs without them (:attr:`checking` False:
        the listener stops sending :attr:`along`)."""
        if not self.checking:
            return False
        try:
            if isinstance(along, BaseException):
                raise along
            if along is None:
                along = self._read_limit()
        except redis.exceptions.NoPermissionError as error:
            self.checking = False
            log.warning(
                "consumer %s: cannot read %s (%s); kind %s runs without its limit",
                self.consumer,
                self.keys.kind_limits,
                error,
                self.kind,
            )
            return False
        return along is not None

    def _read_limit(self) -> Any:
        """The kind's limit, asked now; when :attr:`apart`, reused for a second (a round
        trip to another node per task would cost more than the limit's own work)."""
        if not self.apart:
            return self._client.hget(self.keys.kind_limits, self.kind)
        at, limit = self._limit_read
        now = time.monotonic()
        if now - at > LIMIT_READ_REUSE:
            limit = self._client.hget(self.keys.kind_limits, self.kind)
            self._limit_read = (now, limit)
        return limit

    def call(self, op: str, member: str, order: int = 0, *more: str) -> Any:
        """One operation of the script (ARGV[4] ``order``, ARGV[8..] ``more``)."""
        return self._evalsha(
            [
                *_script_keys(self.keys, self.kind),
                *_script_args(self.keys, self.kind, op, member, order, self.lease),
                *more,
            ]
        )

    def member(self, entry_id: str) -> str:
        """What holds a slot or waits for one: a task's :func:`slot_name` and its holder."""
        return slot_name(entry_id) + self._holder

    def take(self, entry_ids: Sequence[bytes]) -> str | list[int] | None:
        """Slots for a batch's tasks, by their stream entry ids, in one call: the member
        that holds them all (when there was room for all and nobody waited), else for
        each task 1 when it holds a slot of its own from now on (member :meth:`member`
        of its id), 0 when it waits in line (:meth:`acquire` waits on). None when the
        kind has no limit. What is held is renewed until released."""
        arguments = list(self._take_args)
        arguments[self._take_count] = len(entry_ids)
        # The first id is enough when all get in at once (the common case); the others
        # are sent when each needs its own slot or place in line.
        reply = self._evalsha([*arguments, entry_ids[0]])
        if reply[0] == -2:
            reply = self._evalsha([*arguments, *entry_ids])
        if reply[0] == 0:
            whole = self.member(entry_ids[0].decode())
            self.renewer.hold(whole)
            return whole
        if reply[0] == -1:
            return None
        got: list[int] = reply[1:]
        self.renewer.hold(
            *[self.member(i.decode()) for i, g in zip(entry_ids, got, strict=True) if g]
        )
        return got

    def give(self, member: str, count: int) -> None:
        """Give back ``count`` of the slots ``member`` holds, now (all: it holds none)."""
        self.call("give", member, count)

    def _evalsha(self, arguments: list[Any]) -> Any:
        """The script with ``arguments`` (its keys and ARGV), packed in C: a release or a
        take may send hundreds, which redis-py would encode one by one in Python."""
        (reply,) = execute(self._client, [("EVALSHA", self._script.sha, _KEYS, *arguments)])
        if isinstance(reply, redis.exceptions.NoScriptError):  # a restarted Redis
            (reply,) = execute(self._client, [("EVAL", self._source, _KEYS, *arguments)])
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def release_command(self, members: Sequence[str]) -> list[Any] | None:
        """The release of ``members``, an EVAL to send in the transaction of their tasks'
        answers (renewals stop now); None when the slots live on another node
        (:attr:`apart`: :meth:`release` them then)."""
        if self.apart:
            return None
        self.renewer.drop(members)
        return [*self._release_head, members[0], *self._release_tail, *members[1:]]

    def release(self, members: Sequence[str]) -> None:
        """Release ``members`` now, best effort (their leases free them anyway)."""
        if not members:
            return
        self.renewer.drop(members)
        try:
            self.call("release", members[0], 0, *members[1:])
        except redis.RedisError as error:
            log.info(
                "slots %s of kind %s: release failed, freed when their leases end: %s",
                ", ".join(members),
                self.kind,
                error,
            )

    def acquire(self, entry_id: str, give_up: Callable[[], str | None]) -> str | None:
        """Wait in line for a slot of the kind. Returns the slot held (its member), None
        when the kind has no limit (any more); raises :class:`GaveUp` with the reason
        ``give_up()`` gave (checked before each attempt: cancelled, stopping), the place
        in line left then."""
        member = self.member(entry_id)
        order = entry_order(entry_id)
        wake = self.keys.slot_wake(self.kind) + member
        waited = False
        while True:
            reason = give_up() if waited else None
            if reason is not None:
                self.call("release", member)
                raise GaveUp(reason)
            got, again = self.call("acquire", member, order)
            if got == 1:
                if waited:
                    log.debug("entry %s: slot of kind %s taken", entry_id, self.kind)
                self.renewer.hold(member)
                return member
            if got == 2:
                return None
            if not waited:
                log.debug("entry %s: waiting for a slot of kind %s", entry_id, self.kind)
            waited = True
            timeout = min(int(again) / 1000, self.check_interval)
            self._client.blpop([wake], timeout=max(timeout, 0.01))
