"""Capped exponential backoff with jitter, for reconnecting to Redis."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass
class Backoff:
    """Delays ``initial * multiplier**n``, at most ``maximum``, each scaled by a
    random factor in ``[1 - jitter, 1]`` so that many listeners do not reconnect
    in lock step. :meth:`reset` after a success starts again from ``initial``.
    """

    # 50 ms first (a failover or a blip is often over by then), 5 s at most (a listener
    # notices Redis is back within seconds, and a dead one costs one attempt per 5 s).
    initial: float = 0.05
    maximum: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.2
    random: Callable[[], float] = field(default=random.random, repr=False)
    attempts: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(
                f"backoff needs 0 < initial <= maximum, got {self.initial} and {self.maximum}"
            )
        if self.multiplier < 1 or not 0 <= self.jitter < 1:
            raise ValueError(
                f"backoff needs multiplier >= 1 and 0 <= jitter < 1, "
                f"got {self.multiplier} and {self.jitter}"
            )

    def next_delay(self) -> float:
        """The delay before the next attempt; counts the attempt."""
        delay = min(self.maximum, self.initial * self.multiplier ** min(self.attempts, 64))
        self.attempts += 1
        return delay * (1.0 - self.jitter * self.random())

    def reset(self) -> None:
        self.attempts = 0
