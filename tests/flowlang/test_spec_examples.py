"""Every example of FLOWLANG.md §2–§3, with the edges the spec lists."""

import pytest

from flowlang.compiler import compile_text
from tests.flowlang.helpers import edge_set, edges

SPEC_EXAMPLES = [
    ("A → B → C", "S→A, A→B, B→C, C→E"),
    ("A :x → B → C; :x → D", "S→A, A→B, B→C, C→E, A→D, D→E"),
    ("A → :x; B → :x; :x C", "S→A, S→B, S→C, A→C, B→C, C→E"),
    ("A → :x C; B → :x", "S→A, S→B, A→C, B→C, C→E"),
    ("A → :meet C → D → E\nB → :meet", "S→A, S→B, A→C, B→C, C→D, D→E', E'→E"),
    (":before → A → B → C\nD → :before", "S→D, D→A, A→B, B→C, C→E"),
    ("A :x → B → C → :x D", "S→A, A→B, B→C, C→D, A→D, D→E"),
    (":start → A → B → :end", "S→A, A→B, B→E"),
    ("A → B → C → :start; D → :end", "S→A, A→B, B→C, C→S, S→D, D→E"),
    ("A → C\nB → C", "S→A, A→C1, S→B, B→C2, C1→E, C2→E"),
    ("A → { B → C  D } → E", "S→A, A→{1, {1→B, B→C, C→}1, {1→D, D→}1, }1→E', E'→E"),
    ("A|B|C → D", "S→{1, {1→A, {1→B, {1→C, A→}1, B→}1, C→}1, }1→D, D→E"),
    ("D → A|B|C", "S→D, D→{1, {1→A, {1→B, {1→C, A→}1, B→}1, C→}1, }1→E"),
    ("A → { :start → B → C → :end } → D", "S→A, A→{1, {1→B, B→C, C→}1, }1→D, D→E"),
    ("{ A { B → C } } → D", "S→{1, {1→A, A→}1, {1→{2, {2→B, B→C, C→}2, }2→}1, }1→D, D→E"),
]


@pytest.mark.parametrize(("text", "expected"), SPEC_EXAMPLES)
def test_spec_example_has_exactly_the_listed_edges(text: str, expected: str) -> None:
    assert edges(compile_text(text)) == edge_set(expected)


def test_a_named_subflow_is_inlined_as_if_written_in_place() -> None:
    named = compile_text("@task X {\n  A\n  B → C\n}\n\nX → D")
    written = compile_text("{\n  A\n  B → C\n}\n→ D")
    assert edges(named) == edges(written)
    assert named.nodes[1].name == "X"


def test_a_task_alias_invokes_its_target_with_the_alias_parameters() -> None:
    aliased = compile_text("@task X = A (- {fruit: banana} -) ;\n\nX → B")
    written = compile_text("A (- {fruit: banana} -) → B")
    assert aliased.interchange() == written.interchange()


def test_labels_inside_a_subflow_are_local_to_it() -> None:
    graph = compile_text("A :x → { B :x → C; :x → D } → E; :x → F")
    assert edges(graph) >= edge_set("A→F, B→D")
    assert "A→D" not in edges(graph)


def test_arrow_glued_to_names_reads_as_an_arrow() -> None:
    assert edges(compile_text("A->B")) == edge_set("S→A, A→B, B→E")


def test_task_names_may_contain_colons_and_dashes() -> None:
    graph = compile_text("my:peel-banana → range(- {start: 1, end: 10} -)")
    assert [n.name for n in graph.tasks()] == ["my:peel-banana", "range"]
    assert graph.tasks()[0].kind_prefix == "my"
    assert graph.tasks()[1].params == {"start": 1, "end": 10}


def test_comments_run_to_the_end_of_the_line() -> None:
    graph = compile_text("# first\nA :out → B; # after\n:out → C\n#:out → D")
    assert edges(graph) == edge_set("S→A, A→B, A→C, B→E, C→E")


def test_a_statement_may_span_lines_and_end_with_a_semicolon() -> None:
    assert edges(compile_text("transform →\ninference →\nstore;")) == edge_set(
        "S→transform, transform→inference, inference→store, store→E"
    )


def test_node_ids_follow_the_text_with_the_start_first_and_the_end_last() -> None:
    graph = compile_text("A → { B C } → D")
    kinds = [str(n.kind) for n in graph.nodes]
    assert kinds == ["start", "task", "subflow-start", "task", "task", "subflow-end", "task", "end"]
    assert [n.id for n in graph.nodes] == list(range(len(graph.nodes)))
