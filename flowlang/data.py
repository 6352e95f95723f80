"""The data rules of FLOWLANG.md §7, as pure functions.

Shared by the in-memory runner and the Redis engine: how a step's inputs are
gathered (:func:`gather`), merged (:func:`merge`) and tested by a guard
(:func:`guard_matches`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from jsonpath_ng.ext import parse as jsonpath_parse

__all__ = ["DataError", "compile_guard", "gather", "guard_matches", "merge"]


class DataError(ValueError):
    """Raised when a value breaks a data rule (merging a non-object, a bad guard)."""


def gather(values: list[Any]) -> Any:
    """The input of a step from its predecessors' outputs, in predecessor order.

    One value passes as it is. Several form a list, except that ``{}`` values
    collapse: all ``{}`` give ``{}``; otherwise they are dropped, and a single
    value left passes alone. ``[]`` never collapses.
    """
    if len(values) == 1:
        return values[0]
    kept = [v for v in values if not (isinstance(v, dict) and not v)]
    if not kept:
        return {}
    if len(kept) == 1:
        return kept[0]
    return kept


def merge(value: Any) -> dict[str, Any]:
    """``>``: a list of objects becomes one object (later keys win); an object passes."""
    if isinstance(value, dict):
        return value
    if not isinstance(value, list):
        raise DataError(f"cannot merge {_describe(value)}: expected an object or a list of objects")
    merged: dict[str, Any] = {}
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise DataError(f"cannot merge: item {index} is {_describe(item)}, not an object")
        merged.update(item)
    return merged


@lru_cache(maxsize=4096)
def compile_guard(expression: str) -> Any:
    """Parse a JSONPath guard once. Raises :class:`DataError` when it is not valid JSONPath."""
    try:
        return jsonpath_parse(expression)
    except Exception as error:  # jsonpath-ng raises plain Exception for some syntax errors
        raise DataError(f"invalid JSONPath guard `{expression}`: {error}") from None


def guard_matches(expression: str, value: Any) -> bool:
    """True when the guard finds at least one value in ``value``.

    A guard that starts with a root filter (``$[?(...)]``) tests an object
    input as if it were the one item of a list.
    """
    path = compile_guard(expression)
    if isinstance(value, dict) and expression.lstrip().startswith("$[?"):
        value = [value]
    try:
        return bool(path.find(value))
    except Exception as error:  # jsonpath-ng raises assorted errors on odd data
        raise DataError(f"guard `{expression}` failed on the input: {error}") from None


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    if value is None:
        return "null"
    return f"{type(value).__name__} {value!r}"
