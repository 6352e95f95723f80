"""The slots a task worker holds for the batch in hand, when its kind has a limit.

A batch's tasks take their slots in one call as the batch comes
(:meth:`lifecycle.kind_limits.KindSlots.take`), and release them in one call sent with
the batch's answers: two scripts per batch, not per task. With room for all and nobody
waiting, one holder holds the whole batch's slots. Otherwise the batch's first tasks
hold one each, and the others wait in line when their turn comes, after the slots of
the batch's tasks that already ran are released (they are done: a limit of 1 would
otherwise wait for the batch's own answers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import redis

from lifecycle.kind_limits import KindSlots
from rqse.errors import BatchWeather
from rqse.weather import describe, is_weather

__all__ = ["BatchSlots"]

log = logging.getLogger(__name__)


class BatchSlots:
    """One kind's slots for the batch in hand, by entry id (:meth:`take` per batch,
    :meth:`hold` per task, :meth:`finish` at the batch's end)."""

    def __init__(self, slots: KindSlots):
        self.slots = slots
        self._whole: str | None = None  # the holder of the whole batch's slots
        self._whole_left = 0  # how many of them it still holds (each failed task gives one)
        self._taken: list[str] = []  # else: entry ids holding a slot of their own
        self._waiting: set[str] = set()  # entry ids the batch found no slot for
        self._held: list[str] = []  # entry ids handed the slot taken for them
        self._ran: list[str] = []  # members whose task ran: released with the answers

    def take(self, entry_ids: Sequence[bytes]) -> bool:
        """Take slots for the batch's tasks to run; False when the kind has no limit."""
        self._release_unused()
        if not entry_ids or not self.slots.checking:
            return False
        try:
            taken = self.slots.take(entry_ids)
        except redis.exceptions.NoPermissionError as error:
            self.slots.checking = False
            log.warning(
                "consumer %s: may not hold slots of kind %s (%s); it runs without its limit",
                self.slots.consumer,
                self.slots.kind,
                error,
            )
            return False
        if taken is None:
            return False
        if isinstance(taken, str):
            self._whole, self._whole_left = taken, len(entry_ids)
            return True
        self._taken = [i.decode() for i, got in zip(entry_ids, taken, strict=True) if got]
        if len(self._taken) < len(entry_ids):
            self._waiting = {i.decode() for i, got in zip(entry_ids, taken, strict=True) if not got}
        return True

    def hold(self, entry_id: str, give_up: Callable[[], str | None]) -> str | None:
        """The slot for this entry's task: the one taken for it, else one waited for in
        line (:class:`lifecycle.kind_limits.GaveUp` when ``give_up()`` gave a reason
        meanwhile); None when the kind's limit went meanwhile (run it without). Redis
        weather met on the way is :class:`rqse.BatchWeather`: the slots may live on
        another server than the task's stream, and waiting for one is not the task's
        work, so the delivery is not counted."""
        if self._whole is not None:
            return self._whole
        if entry_id not in self._waiting:
            self._held.append(entry_id)
            return self.slots.member(entry_id)
        self._waiting.discard(entry_id)
        try:
            self._release_done()
            return self.slots.acquire(entry_id, give_up)
        except redis.RedisError as error:
            if is_weather(error):
                raise BatchWeather(f"kind {self.slots.kind}'s slots: {describe(error)}") from error
            raise

    def ran(self, slot: str) -> None:
        """The slot's task ran: its slot goes with the batch's answers."""
        if slot is not self._whole:
            self._ran.append(slot)

    def failed(self, slot: str) -> None:
        """The slot's task raised (its entry stays pending): its slot goes now."""
        if slot is self._whole:
            try:
                self.slots.give(slot, 1)
            except redis.RedisError as error:  # held until the batch's release, or its lease
                log.info("slot %s of kind %s: not given back now: %s", slot, self.slots.kind, error)
            self._whole_left -= 1
            if not self._whole_left:  # all given back: the holder is gone
                self.slots.renewer.drop([slot])
                self._whole = None
        else:
            self.slots.release([slot])

    def finish(self) -> list[Any] | None:
        """At the batch's end: the release to send with its answers (None: nothing to
        send); slots taken for tasks that did not run (a stop) are released now, but
        a whole batch's, which go with the answers."""
        whole, self._whole = self._whole, None
        if whole is not None:
            ran = [whole]
        else:
            self._release_unused()
            ran, self._ran = self._ran, []
            if not ran:
                return None
        command = self.slots.release_command(ran)
        if command is None:  # the slots live on another node than the answers
            self.slots.release(ran)
        return command

    def _release_done(self) -> None:
        """Before a task waits: the slots of the batch's tasks that ran, and of those
        taken for entries never handed theirs (dead-lettered unread). The tasks taken
        for lead the batch, so none of those will run any more."""
        done, self._ran = self._ran, []
        if len(self._held) < len(self._taken):
            handed = set(self._held)
            done += [self.slots.member(i) for i in self._taken if i not in handed]
            self._taken = list(self._held)
        self.slots.release(done)

    def _release_unused(self) -> None:
        """Slots taken for entries never handed theirs, and places in line of entries
        never run (the batch was cut short: a stop, an entry dead-lettered unread)."""
        whole, taken, held, waiting = self._whole, self._taken, self._held, self._waiting
        self._whole, self._taken, self._held, self._waiting = None, [], [], set()
        unused = [self.slots.member(i) for i in waiting]
        if whole is not None:
            unused.append(whole)
        elif len(held) < len(taken):
            handed = set(held)
            unused += [self.slots.member(i) for i in taken if i not in handed]
        self.slots.release(unused)
