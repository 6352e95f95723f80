"""``python -m workers run module:Class``: load a listener class, run N of it, stop cleanly.

Instances run in threads of one process and share one connection pool; each
has its own consumer name (``NAME-0``, ``NAME-1``, ... with ``--consumer NAME``,
else rqse's ``<host>-<pid>-<random>``). Threads suit tasks that wait (I/O,
remote jobs, sleeps); for CPU-bound tasks start several processes instead (one
command each) — they share the kind's consumer group the same way.

Shutdown (SIGTERM or SIGINT): the handler only sets a flag; the main thread then
asks every listener to stop. Each finishes the task in hand, acknowledges its
batch and returns; tasks not started stay pending on their consumer and are
handed to a peer after ``claim_idle`` (or to the same consumer name on restart).
A second signal exits at once.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

import redis

from lifecycle.keys import TASK_GROUP, Keys
from rqse import EventListener
from workers.errors import WorkerLoadError
from workers.task import TaskListener

__all__ = ["Runner", "build_listener", "load_listener_class"]

log = logging.getLogger(__name__)


def load_listener_class(spec: str) -> type[EventListener]:
    """The class named by ``package.module:ClassName``; raises WorkerLoadError in one
    line (``FILE:LINE:COL: SyntaxError: ...`` for a module that does not compile)."""
    module_name, colon, class_name = spec.partition(":")
    if not colon or not module_name or not class_name:
        raise WorkerLoadError(f"{spec!r}: expected package.module:ClassName")
    try:
        module = importlib.import_module(module_name)
    except SyntaxError as error:  # the author's mistake: point at it, as a compiler would
        where = f"{error.filename}:{error.lineno}:{error.offset}"
        raise WorkerLoadError(f"{where}: {type(error).__name__}: {error.msg}") from None
    except ImportError as error:
        raise WorkerLoadError(f"{spec!r}: cannot import {module_name!r}: {error}") from None
    except Exception as error:  # code run at import failed: one line, not a traceback
        raise WorkerLoadError(
            f"{spec!r}: importing {module_name!r} raised {type(error).__name__}: {error}"
        ) from None
    found: Any = module
    for part in class_name.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise WorkerLoadError(f"{spec!r}: module {module_name!r} has no {class_name!r}")
    if not (inspect.isclass(found) and issubclass(found, EventListener)):
        raise WorkerLoadError(
            f"{spec!r} is {found!r}, expected a subclass of rqse.EventListener "
            "(or workers.TaskListener)"
        )
    return found


def build_listener(
    cls: type[EventListener],
    *,
    keys: Keys,
    pool: redis.ConnectionPool,
    consumer: str | None = None,
    kind: str | None = None,
    options: dict[str, Any] | None = None,
) -> EventListener:
    """One instance of ``cls``, given what its constructor accepts.

    A TaskListener gets ``kind`` (if given), ``keys``, ``pool``, ``consumer``.
    A seed-style EventListener whose constructor takes the stream (``key``)
    gets ``{flow}:tasks:<kind>`` (``--kind`` is required unless ``key`` has a
    default) and group ``workers`` if it takes ``group``; then ``pool`` and ``consumer`` if it
    takes them. Signals are handled by the runner, not by the instances.
    """
    kwargs: dict[str, Any] = dict(options or {})
    parameters = inspect.signature(cls).parameters
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())

    def accepts(name: str) -> bool:
        return name in parameters or open_ended

    if issubclass(cls, TaskListener):
        if kind:
            kwargs["kind"] = kind
        kwargs["keys"] = keys
    else:
        key = parameters.get("key")
        if key is not None and kind:
            kwargs["key"] = keys.tasks(kind)
        elif key is not None and key.default is inspect.Parameter.empty:
            raise WorkerLoadError(
                f"{cls.__module__}:{cls.__qualname__} takes a stream key: "
                "give the task kind it serves with --kind"
            )
        if "group" in parameters:
            kwargs["group"] = TASK_GROUP
    kwargs["pool"] = pool
    if consumer is not None:
        if not accepts("consumer"):
            raise WorkerLoadError(
                f"{cls.__module__}:{cls.__qualname__} takes no consumer= argument, so "
                "--consumer cannot name it (pass consumer on to EventListener)"
            )
        kwargs["consumer"] = consumer
    if accepts("handle_signals"):
        kwargs["handle_signals"] = False
    unknown = [name for name in kwargs if not accepts(name)]
    if unknown:
        raise WorkerLoadError(
            f"{cls.__module__}:{cls.__qualname__} does not accept {', '.join(unknown)}"
        )
    try:
        return cls(**kwargs)
    except TypeError as error:
        raise WorkerLoadError(f"cannot build {cls.__qualname__}: {error}") from error


class Runner:
    """Runs listeners in threads until stopped; ``run()`` returns when all have stopped."""

    def __init__(self, listeners: Sequence[EventListener], drain_timeout: float = 30.0) -> None:
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

    def _listen(self, listener: EventListener) -> None:
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
