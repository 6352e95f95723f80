"""What a ``wait:`` task asks for, read from its name, parameters and input.

Pure functions, no Redis: :func:`wait_spec` turns a start-task into a
:class:`Delay`, :class:`EventWait` or :class:`Latch`, or raises
:class:`~workers.errors.WaitParameterError` / :class:`~workers.errors.TemplateError`
with a message that becomes the task's FAILURE.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workers.errors import WaitParameterError
from workers.task import Task
from workers.templates import render, resolve

__all__ = ["Delay", "EventWait", "Latch", "WaitSpec", "parse_duration", "wait_spec"]

OPERATIONS = ("delay", "event", "acquire", "release", "countdown")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# Due times are integer milliseconds scored in a sorted set (exact up to 2**53 ms):
# a hundred years is far beyond any real delay and far within that.
MAX_SECONDS = 100 * 365 * 86400
# A latch name, an event kind and a channel become parts of Redis key names and
# are compared on every event: a template that renders to a page of text is a mistake.
MAX_NAME_CHARS = 1024
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: Any) -> float:
    """Seconds from ``60``, ``2.5``, ``"60"``, ``"90s"``, ``"5m"``, ``"1h"``, ``"1h30m"``,
    ``"500ms"``, ``"1d"``; raises WaitParameterError for anything else or a negative."""
    if isinstance(value, bool) or value is None:
        raise WaitParameterError(f"duration {value!r}: expected seconds or text like '90s'")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond any float
            seconds = math.inf
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            seconds, end = 0.0, 0
            for part in _PART.finditer(text):
                if part.start() != end:
                    break
                seconds += float(part.group(1)) * _UNITS[part.group(2)]
                end = part.end()
            if end != len(text) or not text:
                raise WaitParameterError(
                    f"duration {value!r}: expected seconds or a number with a unit "
                    "(ms, s, m, h, d), e.g. '90s', '5m', '1h30m'"
                ) from None
    else:
        raise WaitParameterError(f"duration {value!r}: expected seconds or text like '90s'")
    if not math.isfinite(seconds) or seconds < 0:
        raise WaitParameterError(f"duration {value!r}: must be zero or more seconds")
    if seconds > MAX_SECONDS:
        raise WaitParameterError(
            f"duration {value!r}: more than {MAX_SECONDS // 86400 // 365} years"
        )
    return seconds


@dataclass(frozen=True, slots=True)
class Delay:
    seconds: float


@dataclass(frozen=True, slots=True)
class EventWait:
    """Wait for an event of ``event`` kind addressed to the waiting workflow (its
    ``workflow`` field) or to ``channel`` (its ``channel`` field; None: no channel),
    whose fields include ``match`` (None: any)."""

    event: str
    match: dict[str, Any] | None
    receipt: bool
    channel: str | None = None


@dataclass(frozen=True, slots=True)
class Latch:
    """``acquire``, ``release`` or ``countdown`` on the global latch ``name``."""

    operation: str
    name: str


WaitSpec = Delay | EventWait | Latch


def _scope(task: Task) -> dict[str, Any]:
    return {"input": task.input, "parameters": dict(task.parameters)}


def _name(task: Task, parameter: str, template: str) -> str:
    """The parameter's template rendered, within :data:`MAX_NAME_CHARS`."""
    text = render(template, _scope(task))
    if len(text) > MAX_NAME_CHARS:
        raise WaitParameterError(
            f"{task.name}: parameter {parameter!r} renders to {len(text):,} characters, "
            f"more than {MAX_NAME_CHARS:,}"
        )
    return text


def wait_spec(task: Task) -> WaitSpec:
    """The wait a ``wait:<operation>`` task asks for."""
    operation = task.operation
    params = task.parameters
    if operation == "delay":
        if "duration" not in params:
            raise WaitParameterError(f"{task.name}: parameter 'duration' is missing")
        return Delay(parse_duration(params["duration"]))
    if operation == "event":
        return _event_wait(task)
    if operation in ("acquire", "release", "countdown"):
        name = params.get("name")
        if not isinstance(name, str) or not name:
            raise WaitParameterError(
                f"{task.name}: parameter 'name' must be a non-empty string, got {name!r}"
            )
        return Latch(operation, _name(task, "name", name))
    raise WaitParameterError(
        f"unknown built-in task {task.name!r} (expected wait:{', wait:'.join(OPERATIONS)})"
    )


def _event_wait(task: Task) -> EventWait:
    params = task.parameters
    kind = params.get("event")
    if not isinstance(kind, str) or not kind:
        raise WaitParameterError(
            f"{task.name}: parameter 'event' must name an event kind, got {kind!r}"
        )
    channel = params.get("channel")
    if channel is not None and (not isinstance(channel, str) or not channel):
        raise WaitParameterError(
            f"{task.name}: parameter 'channel' must be a non-empty string, got {channel!r}"
        )
    receipt = params.get("receipt", True)
    if not isinstance(receipt, bool):
        raise WaitParameterError(f"{task.name}: parameter 'receipt' is {receipt!r}, not a boolean")
    match = params.get("match")
    scope = _scope(task)
    if match is None:
        fields = None
    elif match == "input":
        if not isinstance(task.input, Mapping):
            raise WaitParameterError(
                f"{task.name}: 'match: input' needs an object input, got {task.input!r}"
            )
        fields = dict(task.input)
    elif isinstance(match, Mapping):
        # A value that is one field ('{input[id]}') keeps its type: 5 matches 5, not '5'.
        fields = {str(name): resolve(value, scope) for name, value in match.items()}
    else:
        raise WaitParameterError(
            f"{task.name}: parameter 'match' is {match!r}, expected 'input' or an object"
        )
    return EventWait(
        _name(task, "event", kind),
        fields,
        receipt,
        None if channel is None else _name(task, "channel", channel),
    )
