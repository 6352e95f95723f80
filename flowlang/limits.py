"""The limits every door checks, stated once.

Flow text, workflow inputs and task outputs are untrusted: a flow author or a
task's caller may send anything. Each limit here is checked where data enters
(``lifecycle run`` and the Python client at submission, a task worker before it
sends its ``end-task``, the lifecycle worker when it advances) and turns an
oversized or overdeep value into one clear error that fails only the workflow
or task it belongs to. docs/security.md lists them with their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson

from flowlang.errors import FlowError

__all__ = [
    "DEFAULT_LIMITS",
    "GuardTimeout",
    "LimitExceeded",
    "Limits",
    "RunawayLoop",
    "check_value",
    "depth_within",
    "encode_value",
    "limits_changed",
    "limits_with",
    "loads_value",
]

MIB = 1024 * 1024
_ENCODER_DEPTH = 254  # orjson.dumps raises on values nested deeper than this


@dataclass(frozen=True, slots=True)
class Limits:
    """One deployment's limits; :data:`DEFAULT_LIMITS` unless configured."""

    value_bytes: int = 8 * MIB  # one value: a workflow input, a task output, a literal
    depth: int = 256  # nesting of arrays and objects in one value
    items: int = 100_000  # items one iteration (`*`) fans out to
    # Items of one iteration running at once; each that ends starts the next. Bounds what
    # one iteration puts on the task streams and in a workflow's record at a time.
    window: int = 10_000
    flow_bytes: int = 1 * MIB  # one .flow text
    # Nodes of one compiled graph: each use of an @task with a body is a copy of it, so
    # a few hundred bytes of nested uses would otherwise compile to billions.
    nodes: int = 100_000
    guard_ms: int = 100  # time budget of one guard evaluation
    visits: int = 100_000  # visits of nodes on a cycle in one advance of a workflow
    yaml_aliases: int = 100  # alias uses in one YAML document (alias bombs)
    # Task instances one workflow may start over its life (retries not counted); None: no limit.
    # A deployment setting: the flow language has no declaration for it.
    task_starts: int | None = None


DEFAULT_LIMITS = Limits()


def limits_changed(limits: Limits) -> dict[str, Any]:
    """The fields of ``limits`` that differ from the defaults, by name."""
    return {
        name: getattr(limits, name)
        for name in Limits.__dataclass_fields__
        if getattr(limits, name) != getattr(DEFAULT_LIMITS, name)
    }


def limits_with(changes: dict[str, Any]) -> Limits:
    """The defaults with ``changes`` (as :func:`limits_changed` gives them); names that
    are not limits, and values of the wrong type, are left out."""
    kept = {
        name: value
        for name, value in changes.items()
        if name in Limits.__dataclass_fields__
        and (type(value) is int or (value is None and name == "task_starts"))
    }
    return replace(DEFAULT_LIMITS, **kept)  # type: ignore[arg-type]  # checked above


class LimitExceeded(FlowError):
    """Raised when a value, a flow text or a workflow's run breaks one of :class:`Limits`."""


class RunawayLoop(LimitExceeded):
    """Raised when one advance of a workflow visits nodes on a cycle more than
    :attr:`Limits.visits` times: a loop that starts no task. Its position is the node's."""


class GuardTimeout(LimitExceeded):
    """Raised when a guard takes longer than :attr:`Limits.guard_ms` on one input.
    Its position is the guard's step."""


def depth_within(value: Any, limit: int) -> bool:
    """Whether ``value`` nests at most ``limit`` arrays/objects deep (iterative: a value
    too deep for recursion is checked like any other)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        if type(item) is dict:
            children: Any = item.values()
        elif type(item) is list:
            children = item
        else:
            continue
        depth += 1
        if depth > limit:
            return False
        for child in children:
            if type(child) is dict or type(child) is list:
                push((child, depth))
    return True


def encode_value(value: Any, limits: Limits = DEFAULT_LIMITS, what: str = "value") -> bytes:
    """``value`` as JSON bytes, or :class:`LimitExceeded` naming ``what`` and the limit.

    The encoding is the size check, so a caller that stores the value sends these bytes.
    Keys that are not strings are written as strings (``{1: x}`` as ``{"1": x}``), as
    every JSON encoder of the wire format does."""
    # orjson refuses to write values nested deeper than it can (about the default
    # limit): the walk is needed only for a lower limit, or to name the depth.
    if limits.depth < _ENCODER_DEPTH and not depth_within(value, limits.depth):
        raise LimitExceeded(f"{what} nests deeper than {limits.depth} levels")
    try:
        encoded = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except (TypeError, OverflowError, orjson.JSONEncodeError) as error:
        if not depth_within(value, limits.depth):
            raise LimitExceeded(f"{what} nests deeper than {limits.depth} levels") from None
        raise LimitExceeded(f"{what} is not JSON: {error}") from None
    if len(encoded) > limits.value_bytes:
        raise LimitExceeded(
            f"{what} is {len(encoded):,} bytes, more than the limit of {limits.value_bytes:,}"
        )
    return encoded


def check_value(value: Any, limits: Limits = DEFAULT_LIMITS, what: str = "value") -> None:
    """Raise :class:`LimitExceeded` when ``value`` breaks the size or depth limit."""
    encode_value(value, limits, what)


def loads_value(raw: bytes | str, limits: Limits = DEFAULT_LIMITS, what: str = "value") -> Any:
    """Decode JSON text within the limits: :class:`LimitExceeded` for text too large or too
    deep, never RecursionError, ValueError or a crash of the reader."""
    if len(raw) > limits.value_bytes:
        raise LimitExceeded(
            f"{what} is {len(raw):,} bytes, more than the limit of {limits.value_bytes:,}"
        )
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise LimitExceeded(f"{what} is not JSON: {error}") from None
    if not depth_within(value, limits.depth):
        raise LimitExceeded(f"{what} nests deeper than {limits.depth} levels")
    return value
