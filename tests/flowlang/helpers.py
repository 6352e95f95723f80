"""Helpers for flowlang tests: graphs as labelled edge sets."""

from __future__ import annotations

from collections import Counter

from flowlang.graph import Graph, NodeKind


def node_labels(graph: Graph) -> dict[int, str]:
    """S for the start, E for the end, task names numbered by occurrence when repeated
    (C1, C2; a task named E is E'), ``{n``/``}n`` for the n-th subflow's start/end,
    the URI or ``<>`` for resources."""
    names = Counter(n.name for n in graph.nodes if n.kind is NodeKind.TASK)
    seen: Counter[str] = Counter()
    subflows = 0
    labels: dict[int, str] = {}
    for node in graph.nodes:
        if node.kind is NodeKind.START:
            labels[node.id] = "S"
        elif node.kind is NodeKind.END:
            labels[node.id] = "E"
        elif node.kind is NodeKind.SUBFLOW_START:
            subflows += 1
            labels[node.id] = f"{{{subflows}"
            labels[node.pair] = f"}}{subflows}"
        elif node.kind is NodeKind.TASK:
            assert node.name is not None
            seen[node.name] += 1
            label = node.name + (str(seen[node.name]) if names[node.name] > 1 else "")
            # A task called S or E is primed, so it differs from the start and the end.
            labels[node.id] = label + "'" if label in ("S", "E") else label
        elif node.kind in (NodeKind.SOURCE, NodeKind.SINK):
            labels[node.id] = node.name or "<>"
    return labels


def edges(graph: Graph) -> set[str]:
    labels = node_labels(graph)
    return {f"{labels[a]}→{labels[b]}" for a, b in graph.edges}


def edge_set(spec: str) -> set[str]:
    """'S→A, A→B' → {'S→A', 'A→B'}."""
    return {part.strip() for part in spec.split(",") if part.strip()}
