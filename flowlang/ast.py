"""The syntax tree of a flow file: frozen dataclasses with source positions.

Built by :mod:`flowlang.parser` from the Lark parse tree; turned into a graph
by :mod:`flowlang.compiler`. Literal values are already parsed (YAML/JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Pos:
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


@dataclass(frozen=True, slots=True)
class Literal:
    """A parameter or resource literal: its parsed value (``{}`` for an empty one)."""

    value: Any
    pos: Pos


@dataclass(frozen=True, slots=True)
class Label:
    name: str
    pos: Pos


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    params: Literal | None
    pos: Pos


@dataclass(frozen=True, slots=True)
class Subflow:
    """A `{ ... }` block, a `A|B|C` fan (``fan=True``) or an inlined `@task` body."""

    statements: tuple[Statement, ...]
    pos: Pos
    end_pos: Pos
    fan: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    body: Task | Subflow
    pos: Pos
    input_label: Label | None = None
    output_label: Label | None = None
    iterate: bool = False
    merge: bool = False
    guard: str | None = None


@dataclass(frozen=True, slots=True)
class LiteralSource:
    value: Any
    pos: Pos


@dataclass(frozen=True, slots=True)
class UriResource:
    """`<uri>` with optional parameters: a source at a statement's start, a sink at its end."""

    uri: str
    params: Literal | None
    pos: Pos


@dataclass(frozen=True, slots=True)
class LabelTarget:
    label: Label
    merge: bool = False


@dataclass(frozen=True, slots=True)
class SinkTarget:
    resource: UriResource
    merge: bool = False


Head = Step | Label | LiteralSource | UriResource
Target = LabelTarget | SinkTarget


@dataclass(frozen=True, slots=True)
class Statement:
    head: Head
    steps: tuple[Step, ...]  # the steps after the head, in order
    target: Target | None
    pos: Pos


@dataclass(frozen=True, slots=True)
class FlowDeclaration:
    name: str
    params: Literal | None
    doc: str | None
    pos: Pos


@dataclass(frozen=True, slots=True)
class TaskDeclaration:
    name: str
    pos: Pos
    alias: str | None = None
    params: Literal | None = None
    doc: str | None = None
    body: Subflow | None = None


@dataclass(frozen=True, slots=True)
class Flow:
    statements: tuple[Statement, ...]
    flow: FlowDeclaration | None = None
    tasks: dict[str, TaskDeclaration] = field(default_factory=dict)
