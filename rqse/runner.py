"""Run several listeners in threads of one process until a signal, then drain them.

One thread per listener; SIGTERM or SIGINT only sets a flag, then the main thread
asks every listener to stop: each finishes what it has in hand, acknowledges its
batch and returns, within one ``drain_timeout`` for all. Entries not started stay
pending for a peer. A second signal exits at once. One listener that dies stops
the process (exit status 1), so that a supervisor restarts it whole.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Protocol

__all__ = ["Listening", "Runner"]

log = logging.getLogger(__name__)


class Listening(Protocol):
    """What a runner runs: an rqse.EventListener, or anything that listens like one."""

    @property
    def consumer(self) -> str: ...

    def listen(self) -> object: ...

    def stop(self) -> None: ...


class Runner:
    """Runs listeners in threads until stopped; ``run()`` returns when all have stopped."""

    def __init__(self, listeners: Sequence[Listening], drain_timeout: float = 30.0) -> None:
        self.listeners = list(listeners)
        self.drain_timeout = drain_timeout
        self._stop = threading.Event()
        self._signals = 0
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self) -> None:
        for listener in self.listeners:
            thread = threading.Thread(
                target=self._listen, args=(listener,), name=f"worker-{listener.consumer}"
            )
            thread.daemon = True  # a forced exit must not wait for a task in hand
            thread.start()
            self._threads.append(thread)

    def _listen(self, listener: Listening) -> None:
        try:
            listener.listen()
        except BaseException as error:
            log.error("consumer %s: stopped by %r", listener.consumer, error, exc_info=True)
            self.errors.append(error)
            self._stop.set()  # one dead listener stops the process: a supervisor restarts it

    def stop(self) -> None:
        """Ask every listener to stop after its task in hand; idempotent, thread-safe."""
        self._stop.set()

    def run(self, install_signals: bool = True) -> int:
        """Start, wait for a stop (signal or ``stop()``), drain; 0 if clean, 1 if not."""
        previous = {}
        if install_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            self.start()
            while not self._stop.wait(0.5):
                if not any(thread.is_alive() for thread in self._threads):
                    break
            for listener in self.listeners:
                listener.stop()
            deadline = time.monotonic() + self.drain_timeout  # one deadline for all
            for thread in self._threads:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
            stuck = [t.name for t in self._threads if t.is_alive()]
            if stuck:
                log.warning("still busy after %.0fs, exiting: %s", self.drain_timeout, stuck)
            return 1 if stuck or self.errors else 0
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            os._exit(128 + signum)  # second signal: now, tasks in hand stay pending
        self._stop.set()
