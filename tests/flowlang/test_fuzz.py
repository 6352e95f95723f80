"""Property tests of the compiler, the drawings and runs.

Any text compiles to a graph or raises a positioned :class:`FlowError`,
nothing else; generated valid flows always compile to a well-formed graph
whose JSON round-trips; drawings of any graph stay syntactically whole; every
run of a generated flow (cycles, guards, iterations, subflows, literals) on
random task outputs ends, finished or failed with a reason, within the limits.

Examples per property come from ``FLOWLANG_FUZZ_EXAMPLES`` (default 200, the
CI size); the full run is ``FLOWLANG_FUZZ_EXAMPLES=20000 pytest
tests/flowlang/test_fuzz.py``. The runs take theirs from ``FLOWSTREAM_FUZZ_N``
(default 100; ``FLOWSTREAM_FUZZ_N=5000`` for the full run). The deadline is off:
parse time varies with size.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowlang.compiler import compile_text
from flowlang.errors import FlowCycleError, FlowError
from flowlang.graph import Graph, Node, NodeKind
from flowlang.limits import Limits
from flowlang.machine import parse_key
from flowlang.render import to_dot, to_mermaid
from flowlang.runner import TaskCall, run
from tests.flowlang.generators import (
    EXAMPLES,
    FILE,
    FUZZ,
    Part,
    Signature,
    chain,
    join,
    signature,
    valid_flows,
)
from tests.flowlang.render_checks import assert_valid_dot, assert_valid_mermaid

RUN_EXAMPLES = int(os.environ.get("FLOWSTREAM_FUZZ_N", "100"))
RUN_FUZZ = settings(FUZZ, max_examples=RUN_EXAMPLES)
# The full run takes minutes per property: stretch pytest-timeout's 300 s with it.
pytestmark = pytest.mark.timeout(300 + max(EXAMPLES, RUN_EXAMPLES) // 10)


def assert_graph_or_positioned_error(text: str) -> Graph | None:
    """Compile ``text``: a Graph, or a FlowError whose position lies inside the text."""
    try:
        graph = compile_text(text, FILE)
    except FlowError as error:
        assert error.line >= 1 and error.column >= 1, f"no position: {error!r}"
        assert error.line <= _line_count(text), f"line past the end: {error}"
        assert str(error).startswith(f"{FILE}:{error.line}:{error.column}: ")
        assert "\n" not in str(error), "the CLI prints one line per error"
        return None
    assert isinstance(graph, Graph)
    return graph


def _line_count(text: str) -> int:
    # Lines are counted by "\n" only, as Lark counts them ("\f", "\r", "\u2028" are not breaks).
    return text.count("\n") + 1


def test_an_end_of_file_error_counts_lines_by_newline_only() -> None:
    with pytest.raises(FlowError) as caught:
        compile_text("{\fA")  # form feed is whitespace, not a line break
    assert (caught.value.line, caught.value.column) == (1, 4)


# -- (a) any text ------------------------------------------------------------------

LANGUAGE_CHARS = "AZaz_09:-→>{}()[]|*?`<@#;='\"$.,!\n\t "
PIECES = ["->", "'''", ":end", ":start", "(-", "-)", "<-", "({", "})", "([", "])"]
any_text = st.lists(
    st.text(LANGUAGE_CHARS, min_size=1, max_size=3) | st.sampled_from(PIECES) | st.text(max_size=2),
    max_size=40,
).map("".join)


@FUZZ
@given(any_text)
def test_any_text_compiles_or_raises_a_positioned_flow_error(text: str) -> None:
    assert_graph_or_positioned_error(text)


# -- (b) sequences of the language's tokens ------------------------------------------

TOKENS = [
    # names and labels
    "A", "B", "C", "my:peel-banana", "wait:delay", "T-9", "_x", "start", "end",
    ":x", ":y", ":start", ":end", ":bad-",
    # punctuation and modifiers
    "→", "->", "{", "}", "|", "*", ">", ";", "=", "(", ")", "<", "-",
    "? `$.a`", "? `$[?(@.s=0)]`", "? `$[`", "?", "`",
    # parameter literals, good and bad
    "(- a: 1 -)", "(- [1, 2] -)", "(- a: [ -)", "(- 3 -)",
    "(- !!python/object/apply:os.system [ls] -)",
    '({"a": 1})', '({"a": })', "([1, 2])", "([1,])", "()", "(- -)",
    # resources
    "<data.json>", "<http://h/x?q=1>", "<out.json>(- method: PUT -)", "<>", '<{"k": 1}>', "<[1]>",
    "<- a: 1 ->", "<- [ ->", "<{ nope }>",
    # declarations
    "@flow f", "@flow g (- n: 1 -)", "@task X = A", "@task X (- fruit: banana -)",
    "@task Y { A → B }", "@task Z = Y", "@bogus", "'''doc'''", '"""doc"""',
]  # fmt: skip
SEPARATORS = ["", " ", "  ", "\n", "\t", " # comment\n", "\r\n"]


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(TOKENS), st.sampled_from(SEPARATORS)), max_size=25))
def test_token_sequences_compile_or_raise_a_positioned_flow_error(
    pairs: list[tuple[str, str]],
) -> None:
    assert_graph_or_positioned_error("".join(token + sep for token, sep in pairs))


# -- (c) generated valid flows ----------------------------------------------------------

# The flows come from ``valid_flows`` in ``generators``, with the nodes each must compile to.


def reachable(start: int, successors: dict[int, list[int]]) -> set[int]:
    seen, frontier = {start}, [start]
    while frontier:
        for node in successors.get(frontier.pop(), []):
            if node not in seen:
                seen.add(node)
                frontier.append(node)
    return seen


def assert_well_formed(graph: Graph, expected: Counter[Signature]) -> None:
    nodes = graph.nodes
    assert [n.id for n in nodes] == list(range(len(nodes)))
    kinds = Counter(n.kind for n in nodes)
    assert nodes[0].kind is NodeKind.START and nodes[-1].kind is NodeKind.END
    assert kinds[NodeKind.START] == kinds[NodeKind.END] == 1
    assert kinds[NodeKind.SUBFLOW_START] == kinds[NodeKind.SUBFLOW_END]
    drawn = (NodeKind.START, NodeKind.END, NodeKind.SUBFLOW_END)
    actual = Counter(
        signature(n.kind, n.name, n.iterate, n.guard, n.params)
        for n in nodes
        if n.kind not in drawn
    )
    assert actual == expected
    assert all(0 <= a < len(nodes) and 0 <= b < len(nodes) for a, b in graph.edges)
    assert len(set(graph.edges)) == len(graph.edges)
    for node in nodes:
        if node.kind is NodeKind.SUBFLOW_START:
            assert node.pair is not None
            end = nodes[node.pair]
            assert end.kind is NodeKind.SUBFLOW_END and end.pair == node.id and end.id > node.id
            assert end.parent == node.parent
        if node.parent is not None:
            assert nodes[node.parent].kind is NodeKind.SUBFLOW_START

    def out_scope(node: Node) -> int | None:
        return node.id if node.kind is NodeKind.SUBFLOW_START else node.parent

    def in_scope(node: Node) -> int | None:
        return node.pair if node.kind is NodeKind.SUBFLOW_END else node.parent

    for a, b in graph.edges:  # labels are local: no edge leaves its scope
        assert out_scope(nodes[a]) == in_scope(nodes[b]), f"edge {a}→{b} crosses a subflow"
    forward: dict[int, list[int]] = {}
    backward: dict[int, list[int]] = {}
    for a, b in graph.edges:
        forward.setdefault(a, []).append(b)
        backward.setdefault(b, []).append(a)
    everything = set(range(len(nodes)))
    assert reachable(graph.start, forward) == everything, "a node the start does not reach"
    assert reachable(graph.end, backward) == everything, "a node that never reaches the end"


@FUZZ
@given(valid_flows())
def test_generated_valid_flows_compile_to_well_formed_graphs(flow: Part) -> None:
    graph = compile_text(flow.text, FILE)
    assert_well_formed(graph, flow.nodes)
    data = graph.to_json()
    assert Graph.from_json(data).to_json() == data
    assert compile_text(flow.text, FILE).to_json() == data
    assert graph.content_hash() == hashlib.sha256(data).hexdigest()
    assert_valid_mermaid(to_mermaid(graph), graph)
    assert_valid_dot(to_dot(graph), graph)


# -- (d) drawings of graphs with any text in them -------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def nested_graphs(draw: st.DrawFn) -> Graph:
    """Well-nested graphs (as the compiler builds them) whose texts are anything at all."""
    nodes = [Node(0, NodeKind.START)]
    open_starts: list[int] = []
    text = st.one_of(st.none(), st.text())
    for action in draw(st.lists(st.sampled_from(["task", "source", "sink", "open", "close"]))):
        parent = open_starts[-1] if open_starts else None
        node_id = len(nodes)
        if action == "close":
            if open_starts:
                start = nodes[open_starts.pop()]
                start.pair = node_id
                nodes.append(
                    Node(node_id, NodeKind.SUBFLOW_END, parent=start.parent, pair=start.id)
                )
            continue
        kind = {
            "task": NodeKind.TASK,
            "source": NodeKind.SOURCE,
            "sink": NodeKind.SINK,
            "open": NodeKind.SUBFLOW_START,
        }[action]
        node = Node(
            node_id,
            kind,
            name=draw(text),
            params=draw(json_values),
            guard=draw(text),
            iterate=draw(st.booleans()),
            merge=draw(st.booleans()),
            parent=parent,
        )
        nodes.append(node)
        if kind is NodeKind.SUBFLOW_START:
            open_starts.append(node_id)
    while open_starts:
        start = nodes[open_starts.pop()]
        start.pair = len(nodes)
        nodes.append(Node(len(nodes), NodeKind.SUBFLOW_END, parent=start.parent, pair=start.id))
    nodes.append(Node(len(nodes), NodeKind.END))
    ids = st.integers(0, len(nodes) - 1)
    edges = draw(st.lists(st.tuples(ids, ids), max_size=2 * len(nodes), unique=True))
    return Graph(nodes=nodes, edges=edges)


@FUZZ
@given(nested_graphs())
def test_drawings_of_any_names_guards_and_parameters_stay_well_formed(graph: Graph) -> None:
    assert_valid_mermaid(to_mermaid(graph), graph)
    assert_valid_dot(to_dot(graph), graph)


# -- (e) runs of generated flows end, within the limits ------------------------------------

RUN_LIMITS = Limits(visits=2_000, items=20, guard_ms=100)
MAX_TASKS = 150
RETURNS = [
    {},
    {"a": 1, "s": 0, "n": 2},
    {"s": "a" * 27 + "b"},  # the catastrophic regex's input
    {"items": [{"s": 0}]},
    {"a": {"a": {"a": {"a": {}}}}},
    None,
    "text",
    7,
]


@st.composite
def looping_flows(draw: st.DrawFn) -> str:
    """A valid flow, then statements that loop back to the start: through tasks (which
    compile), or through literals and guards only (refused at compile time)."""
    text = draw(valid_flows()).text.rstrip().rstrip(";")  # each statement below adds its ;
    for _ in range(draw(st.integers(0, 2))):
        loop = draw(chain(1, False))
        if draw(st.integers(0, 3)) < 3:  # mostly a task every lap surely starts
            loop.insert(0, Part(draw(st.sampled_from(["A", "B2", "T-9"]))))
        head = draw(st.sampled_from(["", '<{"a": 1}> → ', "<[1, 2]> → ", "<data.json> → "]))
        body = join(draw, loop)
        text += f";\n{head}{body.text} → :start"
    if draw(st.integers(0, 9)) == 9:
        text += ';\n<{"s": 0}> → :start'  # a cycle through a literal alone
    return text


def random_task(seed: int, fails: float) -> Any:
    """Task implementations drawing their outputs from a seeded generator: objects, lists
    (for iterations), the regex's worst input, deep objects, non-objects, failures."""
    rng = random.Random(seed)

    def task(call: TaskCall) -> Any:
        if rng.random() < fails:
            raise RuntimeError(f"{call.name} failed")
        if rng.random() < 0.5:
            items = RETURNS[:5] if rng.random() < 0.7 else RETURNS  # mostly objects
            return [rng.choice(items) for _ in range(rng.randint(0, 25))]
        return rng.choice(RETURNS[:5] if rng.random() < 0.8 else RETURNS)

    return task


def assert_run_ends_within_the_limits(
    graph: Graph, seed: int, fails: float, starts: int | None
) -> None:
    limits = Limits(
        visits=RUN_LIMITS.visits,
        items=RUN_LIMITS.items,
        guard_ms=RUN_LIMITS.guard_ms,
        task_starts=starts,
    )
    started = time.perf_counter()
    result = run(
        graph, random_task(seed, fails), {"in": seed}, retries=1, max_tasks=MAX_TASKS, limits=limits
    )
    assert time.perf_counter() - started < 30
    assert result.status in ("finished", "failed", "running")
    if result.status == "running":  # only the runner's own cap stops a run unfinished
        assert len(result.calls) == MAX_TASKS
    if result.status == "failed":
        assert result.error, "a failed run says why"
    else:
        assert result.error is None
    assert len(result.calls) <= MAX_TASKS
    if starts is not None:  # each start may be retried once
        assert len(result.calls) <= 2 * starts
    for call in result.calls:
        _, path = parse_key(call.key)
        assert all(index < limits.items for index in path), call.key


@RUN_FUZZ
@given(
    looping_flows(),
    st.integers(0, 2**32),
    st.sampled_from([0.0, 0.0, 0.1, 0.5]),
    st.sampled_from([None, None, 30]),
)
def test_every_run_of_a_generated_flow_ends_finished_or_failed_within_the_limits(
    text: str, seed: int, fails: float, starts: int | None
) -> None:
    try:
        graph = compile_text(text, FILE)
    except FlowCycleError as error:  # a loop of literals and guards only: refused
        assert "is on a cycle that can go round without starting a task" in str(error)
        return
    assert_run_ends_within_the_limits(graph, seed, fails, starts)


@RUN_FUZZ
@given(valid_flows(), st.integers(0, 2**32))
def test_a_stored_graph_with_a_literal_loop_fails_in_its_first_step(flow: Part, seed: int) -> None:
    """Graphs stored by other means skip the compiler's check: the machine's cap ends them."""
    graph = compile_text(flow.text, FILE)
    end = graph.nodes.pop()
    loop = Node(len(graph.nodes), NodeKind.SOURCE, params={"a": 1}, line=9, column=1)
    end.id = loop.id + 1
    graph.nodes += [loop, end]
    edges = [(a, end.id if b == loop.id else b) for a, b in graph.edges]
    graph = Graph(nodes=graph.nodes, edges=[*edges, (0, loop.id), (loop.id, 0)])
    result = run(graph, random_task(seed, 0.0), max_tasks=MAX_TASKS, limits=RUN_LIMITS)
    # The loop spins in the first step, so the workflow fails before any task runs: by the
    # cap, or by a data error another branch of that step meets first.
    assert (result.status, result.calls) == ("failed", [])
    assert result.error is not None
    assert 'runaway loop at <{"a":1}>' in result.error or "runaway" not in result.error
