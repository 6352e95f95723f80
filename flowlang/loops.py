"""The compile-time check that every cycle of a flow starts a task on each way round.

A workflow waits only for tasks: a cycle that can go round without starting one
(``<{"a": 1}> → :start``, a loop of literals and subflow edges, a loop whose
tasks are all guarded or iterated) would make one advance of the engine spin
forever. Such a flow is refused with the position of a node on the cycle.
"""

from __future__ import annotations

from flowlang.errors import FlowCycleError
from flowlang.graph import Graph, Node, NodeKind, nodes_on_cycles

__all__ = ["check_loops"]


def check_loops(graph: Graph) -> None:
    """Raise :class:`FlowCycleError` when ``graph`` has a cycle that can go round
    without starting a task."""
    nodes = graph.nodes
    # The graph of ways a transition can move on without starting a task: nodes that
    # always start one are left out; a guarded or iterated subflow can be passed by
    # straight from its start to its end (guard false, or nothing to iterate over).
    successors: list[list[int]] = [[] for _ in nodes]
    for source, target in graph.edges:
        if not _starts_a_task(nodes[source]) and not _starts_a_task(nodes[target]):
            successors[source].append(target)
    for node in nodes:
        if node.kind is NodeKind.SUBFLOW_START and (node.guard or node.iterate):
            assert node.pair is not None
            successors[node.id].append(node.pair)
    looping = nodes_on_cycles(successors)
    if not looping:
        return
    culprit = nodes[min(looping, key=lambda n: (nodes[n].kind is NodeKind.START, n))]
    tasks = sorted({nodes[n].describe() for n in looping if nodes[n].kind is NodeKind.TASK})
    why = ""
    if len(tasks) == 1:
        why = f" ({tasks[0]} is guarded or iterated: it may start nothing)"
    elif tasks:
        why = f" ({', '.join(tasks)} are guarded or iterated: they may start nothing)"
    raise FlowCycleError(
        f"{culprit.describe()} is on a cycle that can go round without starting a task{why}; "
        "a workflow would loop forever",
        culprit.line,
        culprit.column,
    )


def _starts_a_task(node: Node) -> bool:
    """Whether every visit of ``node`` starts a task (or URI source or sink) instance."""
    if node.guard is not None or node.iterate:
        return False
    return (
        node.kind is NodeKind.TASK
        or node.kind is NodeKind.SINK
        or (node.kind is NodeKind.SOURCE and node.name is not None)
    )
