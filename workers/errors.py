"""The errors of the ``workers`` package: one base, one subclass per thing that goes wrong.

A worker turns these into a FAILURE ``end-task`` whose ``error`` is ``str(error)``,
so every message names the offending value and what was expected.
"""

from __future__ import annotations

__all__ = [
    "BadTask",
    "ResourceError",
    "TemplateError",
    "WaitParameterError",
    "WorkerError",
    "WorkerLoadError",
]


class WorkerError(Exception):
    """Base of every error raised by the ``workers`` package."""


class BadTask(WorkerError):
    """Raised when a start-task event lacks a field a worker needs (workflow, name)."""


class TemplateError(WorkerError):
    """Raised when a name template is malformed, reaches beyond item lookup, or names
    an item the input or parameters do not have."""


class WaitParameterError(WorkerError):
    """Raised when a ``wait:`` task has a missing or invalid parameter (duration, event, name)."""


class ResourceError(WorkerError):
    """Raised when a URI source or sink cannot be read or written (bad path, HTTP error,
    unknown format)."""


class WorkerLoadError(WorkerError):
    """Raised when ``python -m workers run`` cannot import or build the listener class."""
