"""What the engine benchmark runs: fixed shapes over many workflows, and shapes of
one workflow that grow with ``--items`` (iteration, a wide join, a subflow chain).

A :class:`Workload` is the flow text, the workflow inputs, the tasks each
workflow runs, and the lifecycle worker flags its size needs (a 200,000-item
iteration is refused under the default ``--max-items``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from flowlang.limits import DEFAULT_LIMITS, Limits

__all__ = [
    "GROWING",
    "NESTING_DEPTH",
    "SHAPES",
    "Workload",
    "join_text",
    "nested_text",
    "workload",
]

# Shapes of many small workflows: (flow text, tasks per workflow).
SHAPES = {
    "chain10": ("→".join(f"A{i}" for i in range(1, 11)), 10),
    "fan": ("A → { B C D E } → F", 6),
    "single": ("A", 1),
    # map10: one task whose output is 10 items (the no-op echoes the list input), then * B, then C.
    "map10": ("A → * B → C", 12),
}
MAP_INPUT = [{"item": i} for i in range(10)]

# The compiler refuses subflows nested deeper than Python's recursion allows (about 150
# levels): the nested shape nests this many at a time and chains such blocks.
NESTING_DEPTH = 100


@dataclass(frozen=True)
class Workload:
    """One benchmark run's work; ``items`` is the size of a growing shape (else None)."""

    shape: str
    text: str
    tasks_per_workflow: int
    make_input: Callable[[int], Any]
    items: int | None = None
    limits: Limits = DEFAULT_LIMITS
    worker_flags: tuple[str, ...] = field(default=())

    def inputs(self, workflows: int) -> list[Any]:
        return [self.make_input(n) for n in range(workflows)]


def join_text(items: int) -> str:
    """``A1|A2|…|AN → C``: N tasks that all start at once and one that waits for all."""
    return "|".join(f"A{i}" for i in range(1, items + 1)) + " → C"


def nested_text(items: int, depth: int = NESTING_DEPTH) -> str:
    """``A → { B → { B → … } } → { B → … } → … → C``: ``items`` subflows of one task
    each, every one entered from the one before, nested ``depth`` at a time."""
    blocks = []
    for first in range(0, items, depth):
        levels = min(depth, items - first)
        blocks.append("{ B → " * (levels - 1) + "{ B" + " }" * levels)
    return " → ".join(["A", *blocks, "C"])


def _iterate(items: int) -> Workload:
    # The workflow input is the list; A (the no-op) echoes it, * B runs once per item,
    # C receives the list of B's outputs. Items are integers: the list of 1,000,000
    # is 6.9 MB, under the 8 MiB a stream entry (and a value) may hold by default.
    values = list(range(items))
    limits = Limits(
        items=max(items, DEFAULT_LIMITS.items),
        value_bytes=max(_encoded_size(values), DEFAULT_LIMITS.value_bytes),
    )
    flags: tuple[str, ...] = ()
    if limits.items > DEFAULT_LIMITS.items:
        flags += ("--max-items", str(limits.items))
    if limits.value_bytes > DEFAULT_LIMITS.value_bytes:
        # Past about 1,200,000 items: the workers' stream entries are still capped at
        # 8 MiB (rqse's max_entry_bytes, no flag), so such a run fails visibly.
        flags += ("--max-value-bytes", str(limits.value_bytes))
    return Workload("iterate", "A → * B → C", items + 2, lambda n: values, items, limits, flags)


def _encoded_size(value: Any) -> int:
    """Bytes of ``value`` as JSON, with room for the fields around it."""
    return len(orjson.dumps(value)) + 4096


def _text_limits(text: str) -> Limits:
    """The flow-size limit guards against untrusted text; the benchmark's own generated
    text may pass it (a 100,000-level chain is 1.0 MB, the default limit 1 MiB)."""
    return Limits(flow_bytes=max(DEFAULT_LIMITS.flow_bytes, len(text.encode())))


def _join(items: int) -> Workload:
    # Each Ai echoes the workflow input; C's input is the list of the N outputs.
    text = join_text(items)
    return Workload("join", text, items + 1, lambda n: {"n": n}, items, _text_limits(text))


def _nested(items: int) -> Workload:
    text = nested_text(items)
    return Workload("nested", text, items + 2, lambda n: {"n": n}, items, _text_limits(text))


GROWING: dict[str, Callable[[int], Workload]] = {
    "iterate": _iterate,
    "join": _join,
    "nested": _nested,
}


def workload(shape: str, items: int | None = None) -> Workload:
    """The workload of ``shape``; a growing shape needs ``items`` (at least 1)."""
    if shape in GROWING:
        if items is None or items < 1:
            raise ValueError(f"--shape {shape} needs --items N (N at least 1), got {items}")
        return GROWING[shape](items)
    text, tasks = SHAPES[shape]
    if shape == "map10":
        return Workload(shape, text, tasks, lambda n: MAP_INPUT)
    return Workload(shape, text, tasks, lambda n: {"n": n})
