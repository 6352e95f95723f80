"""SIGINT/SIGTERM handlers for a listener running in the main thread.

The handler only records the signal and asks the loop to stop (the listener's
callback); the loop finishes the event in hand, acknowledges and returns. A
second signal raises ``SystemExit(128 + signum)`` from the handler, which
interrupts whatever runs (the event in hand stays pending for redelivery).
Handlers are installed only from the main thread (Python allows no other) and
the previous ones are restored when ``listen()`` returns.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["SIGNALS", "SignalHandlers"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SignalHandlers:
    """Install/restore handlers that call ``callback(signum)``."""

    def __init__(self, callback: Callable[[int], None]) -> None:
        self._callback = callback
        self._previous: dict[int, Any] = {}
        self.received: int | None = None  # first signal seen, for the log

    def install(self) -> bool:
        """Install if in the main thread; True if installed."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return True

    def restore(self) -> None:
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._callback(signum)
