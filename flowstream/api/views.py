"""The API's JSON shapes, made from what the engine's readers return.

The data is :func:`lifecycle.inspect.describe_workflow`'s (``inspect --json``);
these functions only add the views the console needs: ``nodes`` (one row per
task instance with the contract's field names) and the graph coloured by state.
"""

from __future__ import annotations

from typing import Any

from flowlang.graph import Graph, Node, NodeKind
from flowlang.machine import parse_key

__all__ = ["graph_view", "node_state", "workflow_view"]

# When a step has several instances (an iteration, retries), the state its node shows:
# the first of these that any instance is in.
_NODE_STATE_ORDER = ("running", "held (paused)", "failed", "abandoned", "ended")


def workflow_view(data: dict[str, Any]) -> dict[str, Any]:
    """``inspect --json``'s data plus ``nodes``: each task instance's key, name, kind,
    state, started, ended, attempt and worker (``tasks`` keeps every field)."""
    nodes = [
        {
            "key": task["key"],
            "name": task["name"],
            "kind": task["kind"],
            "state": task["state"],
            "started": task["started"],
            "ended": task["ended"],
            "attempt": task["attempts"],
            "worker": task["worker"],
        }
        for task in data["tasks"]
    ]
    return {**data, "nodes": nodes}


def node_state(states: list[str]) -> str:
    """The state a graph node shows for its instances' ``states``."""
    for state in _NODE_STATE_ORDER:
        if state in states:
            return state
    return states[0] if states else "not started"


def graph_view(graph: Graph, data: dict[str, Any]) -> dict[str, Any]:
    """The compiled graph as nodes and edges, each task node with the state of its
    instances (:func:`node_state`); start, end, literal and subflow nodes have none.
    ``parent`` is the subflow a node is in; an edge into a guarded node carries the
    guard as its label."""
    by_node: dict[int, list[str]] = {}
    for task in data["tasks"]:
        index = parse_key(task["key"])[0]
        by_node.setdefault(index, []).append(task["state"])
    nodes = []
    for index, node in enumerate(graph.nodes):
        states = by_node.get(index)
        nodes.append(
            {
                "id": str(index),
                "label": _label(node),
                "kind": str(node.kind),
                "state": node_state(states) if states else None,
                "instances": len(states) if states else 0,
                "parent": None if node.parent is None else str(node.parent),
                "line": node.line or None,
            }
        )
    edges = []
    for source, target in graph.edges:
        edge: dict[str, Any] = {"from": str(source), "to": str(target)}
        guard = graph.nodes[target].guard
        if guard is not None:
            edge["label"] = f"? {guard}"
        edges.append(edge)
    return {"nodes": nodes, "edges": edges}


def _label(node: Node) -> str:
    if node.kind in (NodeKind.SOURCE, NodeKind.SINK):
        base = f"<{node.name}>" if node.name else "<literal>"
    elif node.kind is NodeKind.TASK:
        base = node.name or "?"
    else:
        base = str(node.kind)
    return ("* " if node.iterate else "") + ("> " if node.merge else "") + base
