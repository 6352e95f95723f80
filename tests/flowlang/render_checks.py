"""Structural checks of the Mermaid and DOT drawings, shared by the flowlang tests.

Every line must have one of the shapes the renderer may emit, quotes and
clusters balance, every node and edge is there. ``test_cli`` applies them to the
CLI's output, ``test_fuzz`` to drawings of generated graphs.
"""

from __future__ import annotations

import re
from collections import Counter

from flowlang.graph import Graph, NodeKind

_MERMAID_LINE = re.compile(
    r"(?P<indent> *)(?:"
    r'subgraph c(?P<cluster>\d+) \["(?P<title>[^"\n]*)"\]'
    r"|(?P<end>end)"
    r'|n(?P<node>\d+)(?P<open>\(\(\(|\(\(|\(|\[/|\[\()"(?P<text>[^"\n]*)"(?P<close>\)\)\)|\)\)|\)|/\]|\)\])'
    r"|n(?P<source>\d+) --> n(?P<target>\d+)"
    r")"
)
_MERMAID_CLOSERS = {"(((": ")))", "((": "))", "(": ")", "[/": "/]", "[(": ")]"}

_DOT_STRING = r'"(?:[^"\\\n]|\\.)*"'
_DOT_LINE = re.compile(
    r" *(?:"
    r"digraph flow \{"
    r'|node \[fontname="Helvetica"\];'
    r"|subgraph cluster_c(?P<cluster>\d+) \{"
    rf"|label=(?P<title>{_DOT_STRING});"
    rf'|n(?P<node>\d+) \[shape=[a-z]+(?:, style="rounded")?, label=(?P<text>{_DOT_STRING})\];'
    r"|n(?P<source>\d+) -> n(?P<target>\d+);"
    r"|(?P<close>\})"
    r")"
)


def assert_valid_mermaid(text: str, graph: Graph) -> None:
    """Every line is a shape the renderer emits; subgraphs balance; all nodes and edges appear."""
    lines = text.splitlines()
    assert lines[0] == "flowchart TD" and text.endswith("\n")
    depth, nodes, edges, clusters = 0, Counter[int](), Counter[tuple[int, int]](), set()
    for line in lines[1:]:
        match = _MERMAID_LINE.fullmatch(line)
        assert match, f"unexpected Mermaid line {line!r}"
        if match["cluster"]:
            depth += 1
            clusters.add(int(match["cluster"]))
        elif match["end"]:
            depth -= 1
            assert depth >= 0, "'end' without a subgraph"
        elif match["node"]:
            assert _MERMAID_CLOSERS[match["open"]] == match["close"]
            assert not re.search(r"[<>`%]", match["text"].replace("<br>", ""))
            nodes[int(match["node"])] += 1
        else:
            edges[int(match["source"]), int(match["target"])] += 1
    assert depth == 0, "unclosed subgraph"
    _assert_complete(graph, nodes, edges, clusters)


def assert_valid_dot(text: str, graph: Graph) -> None:
    """Every line is a statement the renderer emits; braces balance; all nodes and edges appear."""
    lines = text.splitlines()
    assert lines[0] == "digraph flow {" and lines[-1] == "}" and text.endswith("\n")
    depth, nodes, edges, clusters = 0, Counter[int](), Counter[tuple[int, int]](), set()
    for line in lines:
        match = _DOT_LINE.fullmatch(line)
        assert match, f"unexpected DOT line {line!r}"
        if match["close"]:
            depth -= 1
            assert depth >= 0, "'}' without '{'"
        elif line.endswith("{"):
            depth += 1
            if match["cluster"]:
                clusters.add(int(match["cluster"]))
        elif match["node"]:
            nodes[int(match["node"])] += 1
        elif match["source"]:
            edges[int(match["source"]), int(match["target"])] += 1
    assert depth == 0, "unbalanced braces"
    _assert_complete(graph, nodes, edges, clusters)


def _assert_complete(
    graph: Graph, nodes: Counter[int], edges: Counter[tuple[int, int]], clusters: set[int]
) -> None:
    assert nodes == Counter(n.id for n in graph.nodes), "each node drawn exactly once"
    assert edges == Counter(graph.edges)
    assert clusters == {n.id for n in graph.nodes if n.kind is NodeKind.SUBFLOW_START}
