"""The reference implementation's example flows: all compile, the error ones are rejected."""

from pathlib import Path

import pytest

from flowlang.compiler import compile_text
from flowlang.errors import FlowError

EXAMPLES = Path(__file__).parent / "littleflow_examples"
GOOD = sorted(EXAMPLES.glob("*.flow"))
BAD = sorted((EXAMPLES / "errors").glob("*.flow"))


def test_the_example_set_is_present() -> None:
    assert len(GOOD) >= 80 and len(BAD) >= 2


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_example_compiles_to_a_connected_graph(path: Path) -> None:
    graph = compile_text(path.read_text(encoding="utf-8"), str(path))
    ids = {n.id for n in graph.nodes}
    assert all(a in ids and b in ids for a, b in graph.edges)
    reachable = {graph.start}
    frontier = [graph.start]
    while frontier:
        for successor in graph.successors(frontier.pop()):
            if successor not in reachable:
                reachable.add(successor)
                frontier.append(successor)
    assert reachable == ids, f"unreachable: {ids - reachable}"


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_error_example_is_rejected_with_a_position(path: Path) -> None:
    with pytest.raises(FlowError) as caught:
        compile_text(path.read_text(encoding="utf-8"), str(path))
    assert caught.value.line >= 1 and caught.value.column >= 1
    assert str(caught.value).startswith(f"{path}:{caught.value.line}:{caught.value.column}: ")
