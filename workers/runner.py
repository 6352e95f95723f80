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
from typing import Any

import redis

from lifecycle.keys import TASK_GROUP, Keys
from rqse import EventListener
from rqse.runner import Runner
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
    if "/" in module_name or "\\" in module_name:
        raise WorkerLoadError(
            f"{spec!r}: {module_name!r} is a file path; give the module's dotted name "
            "(package.module:ClassName), importable from the current directory or PYTHONPATH"
        )
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
    home_pool: redis.ConnectionPool | None = None,
) -> EventListener:
    """One instance of ``cls``, given what its constructor accepts.

    A TaskListener gets ``kind`` (if given), ``keys``, ``pool``, ``consumer``, and
    ``home_pool`` (the partitions' shared keys, when given and it takes it).
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
        if home_pool is not None and accepts("home_pool"):
            kwargs["home_pool"] = home_pool
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
