"""The data rules of FLOWLANG.md §7, as pure functions.

Shared by the in-memory runner and the Redis engine: how a step's inputs are
gathered (:func:`gather`), merged (:func:`merge`) and tested by a guard
(:func:`guard_matches`).

Guards are JSONPath (jsonpath-ng's extended syntax) run on untrusted data, so
their cost is bounded: ``=~`` and ``sub(/re/, ...)`` match with RE2, which is
linear in the text (Python's ``re`` backtracks: ``^(a+)+$`` takes seconds on 28
characters); repeating a string or list with ``*`` is refused; a guard has at most
:data:`MAX_DESCENTS` recursive descents (``..``); and every step of an evaluation
counts against a time budget (:class:`GuardBudgetExceeded` past it).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterator
from functools import lru_cache
from time import perf_counter
from typing import Any

import re2  # type: ignore[import-untyped]
from jsonpath_ng import DatumInContext, JSONPath
from jsonpath_ng.ext import parse as jsonpath_parse
from jsonpath_ng.ext.arithmetic import Operation
from jsonpath_ng.ext.filter import Expression
from jsonpath_ng.ext.string import Sub
from jsonpath_ng.jsonpath import Descendants

__all__ = [
    "MAX_DESCENTS",
    "DataError",
    "GuardBudgetExceeded",
    "compile_guard",
    "gather",
    "guard_matches",
    "merge",
]

# `$..a..a` finds each `a` under each `a`: k descents cost up to depth**k steps.
MAX_DESCENTS = 3


class DataError(ValueError):
    """Raised when a value breaks a data rule (merging a non-object, a bad guard)."""


class GuardBudgetExceeded(DataError):
    """Raised when a guard's evaluation runs past the time budget it was given."""


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
    """Parse a JSONPath guard once, its regexes compiled with RE2. Raises
    :class:`DataError` when it is not valid JSONPath, uses a regex RE2 cannot run
    (backreferences, lookaround) or has more than :data:`MAX_DESCENTS` ``..``."""
    try:
        path = jsonpath_parse(expression)
    except Exception as error:  # jsonpath-ng raises plain Exception for some syntax errors
        raise DataError(f"invalid JSONPath guard `{expression}`: {error}") from None
    descents = 0
    for node in _nodes(path):
        if isinstance(node, Descendants):
            descents += 1
        elif isinstance(node, Expression) and node.op == "=~":
            node.regex = _re2(node.value, expression)  # type: ignore[attr-defined]
            node.__class__ = _Re2Match
            continue
        elif isinstance(node, Sub):
            node.regex = _re2(node.expr, expression)
        elif isinstance(node, Operation) and node.op is operator.mul:
            node.op = _multiply
        node.__class__ = _counted(type(node))
    if descents > MAX_DESCENTS:
        raise DataError(
            f"guard `{expression}` has {descents} recursive descents (..), more than "
            f"{MAX_DESCENTS}: each one multiplies the work by the depth of the input"
        )
    return path


def guard_matches(expression: str, value: Any, budget_ms: int | None = None) -> bool:
    """True when the guard finds at least one value in ``value``.

    A guard that starts with a root filter (``$[?(...)]``) tests an object
    input as if it were the one item of a list. With ``budget_ms``, an evaluation
    still running after that many milliseconds raises :class:`GuardBudgetExceeded`.
    """
    path = compile_guard(expression)
    if isinstance(value, dict) and expression.lstrip().startswith("$[?"):
        value = [value]
    if budget_ms is not None:
        _clock.deadline, _clock.steps = perf_counter() + budget_ms / 1000, 0
    try:
        return bool(path.find(value))
    except GuardBudgetExceeded:
        raise
    except Exception as error:  # jsonpath-ng raises assorted errors on odd data
        raise DataError(f"guard `{expression}` failed on the input: {error}") from None
    finally:
        _clock.deadline = None


# -- bounded evaluation ------------------------------------------------------------


class _Clock(threading.local):
    """The budget of the evaluation running in this thread (lifecycle workers may run
    guards in several threads): a deadline (None: no budget) and the steps counted."""

    deadline: float | None = None
    steps: int = 0


_clock = _Clock()
_CHECK_EVERY = 64  # steps between readings of the clock


def _tick() -> None:
    if _clock.deadline is None:
        return
    _clock.steps += 1
    if _clock.steps % _CHECK_EVERY == 0 and perf_counter() > _clock.deadline:
        raise GuardBudgetExceeded("guard evaluation ran past its time budget")


_COUNTED: dict[type, type] = {}


def _counted(cls: type) -> type:
    """``cls`` whose ``find`` counts a step first. Any work past linear in the input goes
    through ``find`` calls (a descent calls its right side per value under it, a filter
    its expressions per candidate), so counting every node's bounds the whole evaluation.
    Empty ``__slots__`` keep the layout, so a parsed node's class can be switched in
    place."""
    found = _COUNTED.get(cls)
    if found is None:
        original = cls.find  # type: ignore[attr-defined]

        def find(self: Any, datum: Any) -> Any:
            clock = _clock
            if clock.deadline is not None:
                clock.steps += 1
                if clock.steps % _CHECK_EVERY == 0 and perf_counter() > clock.deadline:
                    raise GuardBudgetExceeded("guard evaluation ran past its time budget")
            return original(self, datum)

        found = _COUNTED[cls] = type(cls.__name__, (cls,), {"__slots__": (), "find": find})
    return found


class _Re2Match(Expression):
    """``target =~ "regex"`` matched with RE2 (what jsonpath-ng does with ``re.search``)."""

    __slots__ = ()
    regex: Any  # set by compile_guard before the class is switched

    def find(self, datum: Any) -> list[Any]:
        _tick()
        regex = self.regex
        return [
            match
            for match in self.target.find(DatumInContext.wrap(datum))
            if isinstance(match.value, str) and regex.search(match.value)
        ]


def _re2_options() -> Any:
    options = re2.Options()
    options.log_errors = False  # the error comes back as an exception; no stderr lines
    return options


_RE2_OPTIONS = _re2_options()


def _re2(pattern: Any, expression: str) -> Any:
    if not isinstance(pattern, str):
        raise DataError(f"guard `{expression}`: =~ needs a string regex, got {pattern!r}")
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as error:
        reason = error.args[0] if error.args else error
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise DataError(
            f"guard `{expression}`: regex {pattern!r} is not supported: {reason} "
            "(guards match with RE2: no backreferences or lookaround)"
        ) from None


def _multiply(left: Any, right: Any) -> Any:
    # Repeating a string or a list ("a" * 10**9) would build it in memory.
    if isinstance(left, str | list) or isinstance(right, str | list):
        raise TypeError("repetition is not allowed in guards")
    return operator.mul(left, right)


def _nodes(path: Any) -> Iterator[Any]:
    """Every JSONPath node of a parsed path, each once (iteratively)."""
    stack = [path]
    while stack:
        node = stack.pop()
        yield node
        for value in _attributes(node):
            stack.extend(_paths_in(value))


def _attributes(node: Any) -> list[Any]:
    values = list(getattr(node, "__dict__", {}).values())
    for cls in type(node).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(node, name):
                values.append(getattr(node, name))
    return values


def _paths_in(value: Any) -> list[Any]:
    if isinstance(value, JSONPath):
        return [value]
    if isinstance(value, list | tuple):
        return [path for item in value for path in _paths_in(item)]
    return []


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    if value is None:
        return "null"
    return f"{type(value).__name__} {value!r}"
