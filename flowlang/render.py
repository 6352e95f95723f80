"""Drawings of a compiled graph: Mermaid flowcharts and Graphviz DOT.

Both renderers draw the same picture. The start and end are circles, tasks
rounded boxes, sources parallelograms, sinks cylinders; each subflow is a
cluster holding its own ``{`` and ``}`` nodes and its inner steps. A label
reads ``* NAME`` for iteration, ``> NAME`` for merge, with ``? expr`` for a
guard and the parameters as compact JSON on the lines below.

Every label is escaped for its format, so no task name, URI, guard or JSON
value can break the syntax of the output. Node ids are ``n<id>`` and cluster
ids ``c<id>``, never user text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from flowlang.graph import Graph, Node, NodeKind
from flowlang.literals import dumps_compact

__all__ = ["to_dot", "to_mermaid"]

_PARAMS_WIDTH = 40  # longer parameter texts are cut: a drawing is not the place to read them

_BASE = {
    NodeKind.START: "start",
    NodeKind.END: "end",
    NodeKind.SUBFLOW_START: "{",
    NodeKind.SUBFLOW_END: "}",
}

# Opening and closing delimiters of each node shape.
_MERMAID_SHAPES = {
    NodeKind.START: ("((", "))"),
    NodeKind.END: ("(((", ")))"),
    NodeKind.TASK: ("(", ")"),
    NodeKind.SOURCE: ("[/", "/]"),
    NodeKind.SINK: ("[(", ")]"),
    NodeKind.SUBFLOW_START: ("((", "))"),
    NodeKind.SUBFLOW_END: ("((", "))"),
}

_DOT_SHAPES = {
    NodeKind.START: "circle",
    NodeKind.END: "doublecircle",
    NodeKind.TASK: 'box, style="rounded"',
    NodeKind.SOURCE: "parallelogram",
    NodeKind.SINK: "cylinder",
    NodeKind.SUBFLOW_START: "circle",
    NodeKind.SUBFLOW_END: "circle",
}

# Control characters and line separators (a guard may span lines, a URI may hold
# anything but whitespace and angle brackets) are drawn as spaces.
_INVISIBLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")

# Mermaid reads `#name;` entity codes inside quoted text; `"` cannot appear at
# all, `<`/`>`/`&` would be taken as HTML, a backtick opens a Markdown string
# and `%%{` anywhere in the text starts a directive.
_MERMAID_ESCAPES = str.maketrans(
    {
        "#": "#35;",
        '"': "#quot;",
        "<": "#lt;",
        ">": "#gt;",
        "&": "#amp;",
        "`": "#96;",
        "%": "#37;",
    }
)


def _label_lines(node: Node) -> list[str]:
    """The text lines drawn for ``node``: name with its modifiers, guard, parameters."""
    if node.kind in (NodeKind.SOURCE, NodeKind.SINK):
        if node.name is None:  # a literal source: its value is the node
            base, params = "<" + _compact(node.params) + ">", None
        else:
            base, params = f"<{node.name}>", node.params
    elif node.kind is NodeKind.TASK:
        base, params = node.name or "?", node.params
    else:
        base, params = _BASE[node.kind], None
    prefix = ("* " if node.iterate else "") + ("> " if node.merge else "")
    lines = [prefix + base]
    if node.guard is not None:
        lines.append(f"? {node.guard}")
    if params is not None:
        lines.append(_compact(params))
    return lines


def _cluster_title(node: Node) -> str:
    """The title of a subflow's cluster: the `@task` name it inlines, else empty."""
    return node.name or ""


def to_mermaid(graph: Graph) -> str:
    """The graph as a Mermaid ``flowchart``, one subgraph per subflow."""
    lines = ["flowchart TD"]
    for depth, event, node in _layout(graph):
        indent = "  " * (depth + 1)
        if event == "open":
            title = _mermaid_text([_cluster_title(node) or " "])
            lines.append(f"{indent}subgraph c{node.id} [{title}]")
        elif event == "close":
            lines.append(f"{indent}end")
        else:
            opener, closer = _MERMAID_SHAPES[node.kind]
            lines.append(f"{indent}n{node.id}{opener}{_mermaid_text(_label_lines(node))}{closer}")
    lines.extend(f"  n{a} --> n{b}" for a, b in graph.edges)
    return "\n".join(lines) + "\n"


def to_dot(graph: Graph) -> str:
    """The graph as a Graphviz ``digraph``, one ``cluster_`` subgraph per subflow."""
    lines = [
        "digraph flow {",
        '  node [fontname="Helvetica"];',
    ]
    for depth, event, node in _layout(graph):
        indent = "  " * (depth + 1)
        if event == "open":
            lines.append(f"{indent}subgraph cluster_c{node.id} {{")
            lines.append(f"{indent}  label={_dot_text([_cluster_title(node)])};")
        elif event == "close":
            lines.append(f"{indent}}}")
        else:
            label = _dot_text(_label_lines(node))
            lines.append(f"{indent}n{node.id} [shape={_DOT_SHAPES[node.kind]}, label={label}];")
    lines.extend(f"  n{a} -> n{b};" for a, b in graph.edges)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _layout(graph: Graph) -> Iterator[tuple[int, str, Node]]:
    """Walk the nodes as nested clusters: ``(depth, "open"|"node"|"close", node)``.

    A cluster opens at a subflow-start and holds it, its paired end and every
    node whose ``parent`` is that start. Iterative, so nesting depth is not
    bounded by Python's recursion limit; a node the tree does not reach (a
    hand-made graph with a broken ``parent``) is still drawn, at the top level.
    """
    by_id = {node.id: node for node in graph.nodes}
    starts = {n.id for n in graph.nodes if n.kind is NodeKind.SUBFLOW_START}
    paired_ends = {
        n.pair: n.id
        for n in graph.nodes
        if n.id in starts and n.pair in by_id and by_id[n.pair].kind is NodeKind.SUBFLOW_END
    }
    children: dict[int | None, list[Node]] = {}
    for member in graph.nodes:
        if member.id in paired_ends:
            continue  # drawn inside its start's cluster
        scope = member.parent if member.parent in starts and member.parent != member.id else None
        children.setdefault(scope, []).append(member)

    drawn: set[int] = set()
    stack: list[tuple[Node | None, Iterator[Node]]] = [(None, iter(children.get(None, [])))]
    while stack:
        cluster, pending = stack[-1]
        node = next(pending, None)
        if node is None:
            stack.pop()
            if cluster is not None:
                yield len(stack) - 1, "close", cluster
            continue
        if node.id in drawn:
            continue
        drawn.add(node.id)
        depth = len(stack) - 1
        if node.id not in starts:
            yield depth, "node", node
            continue
        yield depth, "open", node
        yield depth + 1, "node", node
        end = by_id.get(node.pair) if node.pair is not None else None
        inner = children.get(node.id, [])
        if end is not None and paired_ends.get(end.id) == node.id:
            inner = [*inner, end]
        stack.append((node, iter(inner)))
    for node in graph.nodes:
        if node.id not in drawn:
            drawn.add(node.id)
            yield 0, "node", node


def _compact(value: Any) -> str:
    text = dumps_compact(value)
    return text if len(text) <= _PARAMS_WIDTH else text[: _PARAMS_WIDTH - 1] + "…"


def _mermaid_text(lines: list[str]) -> str:
    escaped = (_INVISIBLE.sub(" ", line).translate(_MERMAID_ESCAPES) for line in lines)
    return '"' + "<br>".join(escaped) + '"'


def _dot_text(lines: list[str]) -> str:
    """A DOT quoted string; backslashes are doubled so that `\\N`, `\\G`... stay literal."""
    escaped = (
        _INVISIBLE.sub(" ", line).replace("\\", "\\\\").replace('"', '\\"') for line in lines
    )
    return '"' + "\\n".join(escaped) + '"'
