"""Literals, declarations, modifiers and the graph's JSON form."""

import orjson
import pytest

from flowlang.compiler import compile_text
from flowlang.graph import Graph, NodeKind


def only_task(text: str):
    tasks = compile_text(text).tasks()
    assert len(tasks) == 1
    return tasks[0]


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("(- {start: 1, end: 10} -)", {"start": 1, "end": 10}),
        ("(-\nstart: 10\nend: 50\n-)", {"start": 10, "end": 50}),
        ("(-\n- 1\n- 2\n-)", [1, 2]),
        ('({ "json": true })', {"json": True}),
        ('({"a": {"b": [1, {"c": 2}]}})', {"a": {"b": [1, {"c": 2}]}}),
        ("([1,2,3])", [1, 2, 3]),
        ("([\n1,\n2\n])", [1, 2]),
        ("()", {}),
        ("(  )", {}),
        ("(- -)", {}),
        ("(- day: 2024-01-02 -)", {"day": "2024-01-02"}),
        ("(- {1: one} -)", {"1": "one"}),
    ],
)
def test_parameter_literal_gives_its_json_value(literal: str, value: object) -> None:
    assert only_task(f"A {literal}").params == value


def test_a_task_without_literal_or_declaration_has_null_params() -> None:
    assert only_task("A").params is None


@pytest.mark.parametrize(
    ("resource", "value"),
    [
        ("<- customer: C123 ->", {"customer": "C123"}),
        ("<-\n- index: 0\n- index: 1\n->", [{"index": 0}, {"index": 1}]),
        ('<{ "start": true }>', {"start": True}),
        ("<[ 1, 2 ]>", [1, 2]),
        ("<>", {}),
    ],
)
def test_resource_literal_is_a_source_whose_params_are_its_value(
    resource: str, value: object
) -> None:
    graph = compile_text(f"{resource} → A")
    source = graph.nodes[1]
    assert (source.kind, source.name, source.params) == (NodeKind.SOURCE, None, value)
    assert (0, 1) in graph.edges


def test_uri_resources_are_sources_at_the_start_and_sinks_at_the_end() -> None:
    graph = compile_text("<data.json> → A → <http://host/api>(- method: PUT -)")
    source, _, sink = graph.nodes[1:4]
    assert (source.kind, source.name, source.params) == (NodeKind.SOURCE, "data.json", None)
    assert (sink.kind, sink.name, sink.params) == (
        NodeKind.SINK,
        "http://host/api",
        {"method": "PUT"},
    )
    assert (sink.id, graph.end) in graph.edges


def test_declaration_defaults_merge_with_invocation_parameters_invocation_winning() -> None:
    text = "@task A (- {a: 1, b: 2} -)\nA (- b: 3 -) → A → A ()"
    assert [t.params for t in compile_text(text).tasks()] == [
        {"a": 1, "b": 3},
        {"a": 1, "b": 2},
        {"a": 1, "b": 2},
    ]


def test_array_parameters_replace_array_defaults() -> None:
    assert only_task("@task A ([1, 2])\nA ([3])").params == [3]


def test_alias_parameters_layer_over_the_target_declaration() -> None:
    text = "@task A (- {x: 1, y: 1} -)\n@task X = A (- y: 2 -)\nX (- z: 3 -)"
    task = only_task(text)
    assert (task.name, task.params) == ("A", {"x": 1, "y": 2, "z": 3})


def test_declarations_carry_docs_and_the_flow_its_default_input() -> None:
    text = (
        "@flow declarations ({ \"something\" : \"default_input\"})\n'''\nMain doc\n'''\n"
        "@task A ({ \"something\" : \"default_value\"})\n'''\nDoc for A\n'''\nA"
    )
    graph = compile_text(text)
    assert (graph.name, graph.params, graph.doc) == (
        "declarations",
        {"something": "default_input"},
        "Main doc",
    )
    assert graph.tasks()[0].doc == "Doc for A"
    assert graph.tasks()[0].params == {"something": "default_value"}


def test_step_modifiers_are_recorded_on_the_node_or_the_subflow_start() -> None:
    graph = compile_text("A → :x > ? `$.ok` B; C → :x;\nD → * ? `$[0]` { E } → > :end")
    b = next(n for n in graph.nodes if n.name == "B")
    assert (b.merge, b.guard, b.iterate) == (True, "$.ok", False)
    subflow = next(n for n in graph.nodes if n.kind is NodeKind.SUBFLOW_START)
    assert (subflow.merge, subflow.guard, subflow.iterate) == (False, "$[0]", True)
    assert graph.nodes[graph.end].merge


def test_merge_before_a_destination_label_marks_its_readers() -> None:
    graph = compile_text("A → > :x; B → :x; :x C")
    assert next(n for n in graph.nodes if n.name == "C").merge


def test_interchange_json_has_exactly_the_documented_shape() -> None:
    data = compile_text("A → ? `$.x` B").interchange()
    assert set(data) == {"nodes", "edges"}
    for node in data["nodes"]:
        assert set(node) == {"id", "kind", "name", "params", "merge", "guard", "iterate"}
    assert data["nodes"][2]["guard"] == "$.x"
    assert all(isinstance(e, list) and len(e) == 2 for e in data["edges"])


def test_canonical_json_round_trips_and_the_hash_identifies_the_content() -> None:
    graph = compile_text("@flow f (- a: 1 -)\nA → { B C } → * D")
    again = Graph.from_json(graph.to_json())
    assert again.to_json() == graph.to_json()
    assert (
        again.content_hash()
        == graph.content_hash()
        == compile_text("@flow f (- a: 1 -)\nA → { B C } → * D").content_hash()
    )
    assert compile_text("A → { B C } → D").content_hash() != graph.content_hash()
    assert orjson.loads(graph.to_json())["name"] == "f"


def test_subflow_nodes_know_their_pair_and_parent() -> None:
    graph = compile_text("A → { B { C } } → D")
    outer_start, outer_end = graph.nodes[2], graph.nodes[7]
    assert (outer_start.pair, outer_end.pair) == (7, 2)
    inner_start = graph.nodes[4]
    assert inner_start.parent == outer_start.id
    assert graph.nodes[5].parent == inner_start.id
    assert outer_end.parent is None
