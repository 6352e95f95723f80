"""Malformed flows: each gives one clean FILE:LINE:COL error, never a traceback."""

import pytest

from flowlang.compiler import compile_text
from flowlang.errors import (
    FlowDeclarationError,
    FlowError,
    FlowLabelError,
    FlowLiteralError,
    FlowStructureError,
    FlowSyntaxError,
)

MALFORMED = [
    # (flow, error type, line, column, words in the message)
    (
        "A :x → B → C :x → D",
        FlowLabelError,
        1,
        14,
        "output label ':x' defined twice (first at 1:3)",
    ),
    ("A → :x C; B → :x D", FlowLabelError, 1, 15, "input label ':x' defined twice (first at 1:5)"),
    ("A → B;\n:nowhere → C", FlowLabelError, 2, 1, "':nowhere' is read but never defined"),
    ("A :x → B", FlowLabelError, 1, 3, "':x' is defined but never used"),
    ("A → :start B", FlowLabelError, 1, 5, "':start' cannot be an input label"),
    (":end → A", FlowLabelError, 1, 1, "':end' can only end a statement"),
    ("A → B :end", FlowLabelError, 1, 7, "':end' cannot be an output label"),
    ("", FlowStructureError, 1, 1, "the flow has no statement"),
    ("# only a comment\n", FlowStructureError, 1, 1, "the flow has no statement"),
    ("@flow lonely\n@task A", FlowStructureError, 1, 1, "the flow has no statement"),
    ("A → { } → B", FlowStructureError, 1, 5, "empty subflow"),
    ("→ A", FlowSyntaxError, 1, 1, "stray arrow"),
    ("A →", FlowSyntaxError, 1, 3, "stray arrow"),
    ("A → → B", FlowSyntaxError, 1, 5, "stray arrow"),
    ("A (- a: [1, -)", FlowLiteralError, 1, 13, "invalid YAML literal"),
    ('A → B ({"a": })', FlowLiteralError, 1, 14, "invalid JSON literal"),
    ("A (- 5 -)", FlowLiteralError, 1, 3, "must be an object or an array"),
    ("@foo X\nA", FlowDeclarationError, 1, 1, "unknown declaration '@foo'"),
    ("@flow a\n@flow b\nA", FlowDeclarationError, 2, 1, "second @flow declaration"),
    ("@task X = A { B }\nX", FlowDeclarationError, 1, 1, "both an alias and a body"),
    ("@task A (- [1] -)\nA (- a: 1 -)", FlowDeclarationError, 2, 3, "the declaration at 1:9"),
    ("@task X { X }\nX", FlowDeclarationError, 1, 11, "invokes itself"),
    ("@task X = Y\n@task Y = X\nX", FlowDeclarationError, 2, 1, "alias cycle"),
    ("A $ B", FlowSyntaxError, 1, 3, "unexpected character '$'"),
    ("A }", FlowSyntaxError, 1, 3, "unexpected '}'"),
    ("A → ? `$[?(@.x=` B", FlowSyntaxError, 1, 5, "invalid JSONPath guard"),
]


@pytest.mark.parametrize(("text", "kind", "line", "column", "words"), MALFORMED)
def test_malformed_flow_gives_one_located_error(
    text: str, kind: type[FlowError], line: int, column: int, words: str
) -> None:
    with pytest.raises(kind) as caught:
        compile_text(text, "bad.flow")
    error = caught.value
    assert (error.line, error.column) == (line, column), str(error)
    assert words in error.message
    assert str(error).startswith(f"bad.flow:{line}:{column}: ")
    assert "\n" not in str(error)


def test_yaml_that_builds_python_objects_is_rejected() -> None:
    with pytest.raises(FlowLiteralError, match="could not determine a constructor"):
        compile_text('A (- !!python/object/apply:os.system ["echo pwned"] -)')
    with pytest.raises(FlowLiteralError):
        compile_text("<- !!python/object/new:subprocess.Popen [[ls]] -> → A")


def test_errors_in_a_multiline_literal_point_inside_it() -> None:
    with pytest.raises(FlowLiteralError) as caught:
        compile_text("A → B (-\nstart: 10\n  end: [\n-)")
    assert caught.value.line >= 2


def test_nesting_beyond_the_recursion_limit_is_a_flow_error() -> None:
    depth = 400
    with pytest.raises(FlowStructureError, match="nested too deeply"):
        compile_text("A → " + "{ B → " * depth + "C" + " }" * depth, "deep.flow")


def test_moderate_nesting_compiles() -> None:
    depth = 50
    graph = compile_text("A → " + "{ B → " * depth + "C" + " }" * depth)
    assert len(graph.nodes) == 2 + 1 + 3 * depth + 1
