"""Name templates: item lookup only; everything that reaches further is refused."""

from __future__ import annotations

import pytest

from workers.errors import TemplateError
from workers.templates import render, resolve

SCOPE = {"input": {"id": 7, "name": "x", "tags": ["a", "b"], "deep": {"k": True}}, "parameters": {}}


@pytest.mark.parametrize(
    ("template", "text"),
    [
        ("my-{input[id]}", "my-7"),
        ('my-{input["id"]}', "my-7"),
        ("my-{input['name']}", "my-x"),
        ("{input[tags][1]}-{input[tags][-1]}", "b-b"),
        ("{input[deep][k]}", "true"),
        ("{{literal}} {input[id]}", "{literal} 7"),
        ("no fields", "no fields"),
    ],
)
def test_templates_render_item_lookups_into_text(template: str, text: str) -> None:
    assert render(template, SCOPE) == text


def test_a_template_that_is_one_field_resolves_to_the_value_itself() -> None:
    assert resolve("{input[id]}", SCOPE) == 7
    assert resolve("{input[tags]}", SCOPE) == ["a", "b"]
    assert resolve("id {input[id]}", SCOPE) == "id 7"
    assert resolve(5, SCOPE) == 5


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{input.__class__}", "column 7: attribute access ('.') is not allowed"),
        ("{input[id].__init__}", "column 11: attribute access ('.') is not allowed"),
        ("{0.__class__}", "column 2: positional fields are not allowed"),
        ("{}", "column 1: empty field '{}'"),
        ("{input!r}", "column 7: conversions ('!r', '!s', '!a') are not allowed"),
        ("{input:>10}", "column 7: format specs (':...') are not allowed"),
        ("{input[id]:>10}", "column 11: format specs"),
        ("{input[{input[id]}]}", "column 8: nested fields are not allowed"),
        ("{input[id]()}", "column 11: calls are not allowed"),
        ("{input[id]", "column 1: unclosed '{'"),
        ("{input[id}", "column 10: expected ']' after a key, got '}'"),
        ("x}", "column 2: single '}'"),
        ("{input['id]}", "unclosed ' in a key"),
        ("{__import__[os]}", "unknown name '__import__' (expected input or parameters)"),
        ("{input[missing]}", "input has no item 'missing'"),
        ("{input[tags][name]}", "input['tags'] is an array; 'name' is no index"),
        ("{input[tags][5]}", "input['tags'] has no item 5"),
        ("{input[id][0]}", "input['id'] is an int, not an object or array"),
        ("x-{input[deep]}", "the field is an object, expected a string or number"),
    ],
)
def test_template_injection_and_mistakes_are_refused_naming_template_and_column(
    template: str, message: str
) -> None:
    with pytest.raises(TemplateError) as caught:
        render(template, SCOPE)
    text = str(caught.value)
    assert text.startswith(f"template {template!r}: ")
    assert message in text


def test_a_key_with_leading_zeros_is_looked_up_as_written() -> None:
    from workers.templates import render

    assert render("order-{input[007]}", {"input": {"007": "bond", "7": "other"}}) == "order-bond"
    assert render("item-{input[1]}", {"input": ["a", "b"]}) == "item-b"
