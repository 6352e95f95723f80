"""The compiled flow: a sparse graph of nodes and edges.

Node ids are dense integers in the order the nodes appear in the flow text
(the start first, the end last; a subflow's start at its ``{``, its end after
the steps inside it), which is also the order in which a node with several
predecessors receives their outputs. Edges are a list; nothing here is ever
a node×node matrix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

__all__ = ["Graph", "Node", "NodeKind", "downstream", "nodes_on_cycles"]


class NodeKind(StrEnum):
    START = "start"
    END = "end"
    TASK = "task"
    SOURCE = "source"
    SINK = "sink"
    SUBFLOW_START = "subflow-start"
    SUBFLOW_END = "subflow-end"


STARTS = (NodeKind.START, NodeKind.SUBFLOW_START)
ENDS = (NodeKind.END, NodeKind.SUBFLOW_END)


@dataclass(slots=True)
class Node:
    """One node. ``pair`` links a subflow-start and its subflow-end (each names the other);
    ``parent`` is the id of the enclosing subflow-start (None at the top level)."""

    id: int
    kind: NodeKind
    name: str | None = None
    params: Any = None
    merge: bool = False
    guard: str | None = None
    iterate: bool = False
    line: int = 0
    column: int = 0
    parent: int | None = None
    pair: int | None = None
    doc: str | None = None

    @property
    def kind_prefix(self) -> str | None:
        """The task kind: the part of the name before the first ``:`` (None without one)."""
        if self.name is None or ":" not in self.name:
            return None
        return self.name.split(":", 1)[0]

    def describe(self) -> str:
        """The node as the flow text shows it, for messages: a task's name, ``<uri>``, a
        literal's JSON (cut at 40 characters), ``{``/``}`` for a subflow, ``:start``/``:end``."""
        kind = self.kind
        if kind is NodeKind.TASK:
            return self.name or "task"
        if kind in (NodeKind.SOURCE, NodeKind.SINK):
            if self.name is not None:
                return f"<{self.name}>"
            text = orjson.dumps(self.params if self.params is not None else {}).decode()
            return f"<{text if len(text) <= 40 else text[:37] + '...'}>"
        if kind is NodeKind.SUBFLOW_START:
            return f"{self.name} {{" if self.name else "{"
        if kind is NodeKind.SUBFLOW_END:
            return "}"
        return ":start" if kind is NodeKind.START else ":end"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "kind": str(self.kind),
            "name": self.name,
            "params": self.params,
            "merge": self.merge,
            "guard": self.guard,
            "iterate": self.iterate,
            "line": self.line,
            "column": self.column,
        }
        if self.parent is not None:
            data["parent"] = self.parent
        if self.pair is not None:
            data["pair"] = self.pair
        if self.doc is not None:
            data["doc"] = self.doc
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Node:
        return cls(
            id=data["id"],
            kind=NodeKind(data["kind"]),
            name=data.get("name"),
            params=data.get("params"),
            merge=bool(data.get("merge", False)),
            guard=data.get("guard"),
            iterate=bool(data.get("iterate", False)),
            line=data.get("line", 0),
            column=data.get("column", 0),
            parent=data.get("parent"),
            pair=data.get("pair"),
            doc=data.get("doc"),
        )


@dataclass(slots=True)
class Graph:
    """A compiled flow. ``params`` is the `@flow` default input (None without one)."""

    nodes: list[Node]
    edges: list[tuple[int, int]]
    name: str | None = None
    params: Any = None
    doc: str | None = None
    _successors: list[list[int]] | None = field(default=None, repr=False, compare=False)
    _predecessors: list[list[int]] | None = field(default=None, repr=False, compare=False)

    @property
    def start(self) -> int:
        return 0

    @property
    def end(self) -> int:
        return len(self.nodes) - 1

    def _index(self) -> None:
        successors: list[list[int]] = [[] for _ in self.nodes]
        predecessors: list[list[int]] = [[] for _ in self.nodes]
        for source, target in self.edges:
            successors[source].append(target)
            predecessors[target].append(source)
        for preds in predecessors:
            preds.sort()
        self._successors, self._predecessors = successors, predecessors

    def successors(self, node: int) -> list[int]:
        if self._successors is None:
            self._index()
        assert self._successors is not None
        return self._successors[node]

    def predecessors(self, node: int) -> list[int]:
        """Predecessor ids in flow-text order (one entry per edge)."""
        if self._predecessors is None:
            self._index()
        assert self._predecessors is not None
        return self._predecessors[node]

    def tasks(self) -> list[Node]:
        return [n for n in self.nodes if n.kind is NodeKind.TASK]

    # -- serialisation -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "params": self.params,
            "doc": self.doc,
            "nodes": [n.to_dict() for n in self.nodes],
            "edges": [list(e) for e in self.edges],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Graph:
        return cls(
            nodes=[Node.from_dict(n) for n in data["nodes"]],
            edges=[(int(a), int(b)) for a, b in data["edges"]],
            name=data.get("name"),
            params=data.get("params"),
            doc=data.get("doc"),
        )

    def to_json(self) -> bytes:
        """Canonical JSON: sorted keys, compact, UTF-8. Equal graphs give equal bytes."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls, data: bytes | str) -> Graph:
        return cls.from_dict(orjson.loads(data))

    def content_hash(self) -> str:
        """sha256 of :meth:`to_json`: the identity of a compiled flow."""
        return hashlib.sha256(self.to_json()).hexdigest()

    def interchange(self) -> dict[str, Any]:
        """The ``graph --format json`` shape that external tools compare."""
        return {
            "nodes": [
                {
                    "id": n.id,
                    "kind": str(n.kind),
                    "name": n.name,
                    "params": n.params,
                    "merge": n.merge,
                    "guard": n.guard,
                    "iterate": n.iterate,
                }
                for n in self.nodes
            ],
            "edges": [list(e) for e in self.edges],
        }


def nodes_on_cycles(successors: list[list[int]]) -> frozenset[int]:
    """Nodes that can reach themselves (Tarjan's strongly connected components, iterative)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    cyclic: set[int] = set()
    counter = 0
    for root in range(len(successors)):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            if child < len(successors[node]):
                work.append((node, child + 1))
                nxt = successors[node][child]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in successors[node]:
                    cyclic.update(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return frozenset(cyclic)


def downstream(nodes: frozenset[int], successors: list[list[int]]) -> frozenset[int]:
    """``nodes`` and every node reachable from them."""
    seen = set(nodes)
    frontier = list(nodes)
    while frontier:
        for nxt in successors[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return frozenset(seen)
