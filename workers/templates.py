"""Name templates of the built-in tasks: ``'my-{input[id]}'``, ``'my-{input["id"]}'``.

A deliberately tiny language, parsed here and nowhere else — not
``str.format``, which would let a flow author reach attributes of Python
objects (``{input.__class__}``), call formatters (``{x!r}``, ``{x:>10}``) or
index anything. A template is text with fields; ``{{`` and ``}}`` stand for
literal braces. A field is a root name from the scope (``input``,
``parameters``) followed by item lookups only::

    field   = "{" name ( "[" key "]" )* "}"
    key     = 'quoted' | "quoted" | integer | bare word ([A-Za-z0-9_-]+; digits = an integer)

Lookups walk JSON data only: an object by its (string) key, an array by its
integer index. Everything else — ``.``, ``(``, ``!``, ``:``, nested ``{``,
positional fields ``{0}`` — is a :class:`~workers.errors.TemplateError` that
names the template and the 1-based column.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from workers.errors import TemplateError

__all__ = ["Field", "parse_template", "render", "resolve"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BARE = re.compile(r"-?[A-Za-z0-9_]+(?:-[A-Za-z0-9_]+)*")
_INTEGER = re.compile(r"-?[0-9]+")

# What a forbidden character after a name or key means, for the message.
_FORBIDDEN = {
    ".": "attribute access ('.') is not allowed",
    "(": "calls are not allowed",
    "!": "conversions ('!r', '!s', '!a') are not allowed",
    ":": "format specs (':...') are not allowed",
    "{": "nested fields are not allowed",
}
_HINT = " (only item lookup, such as {input[id]} or {input['id']})"


@dataclass(frozen=True, slots=True)
class Field:
    """One ``{...}`` of a template: a root name and the item keys to look up."""

    root: str
    keys: tuple[str | int, ...]
    column: int  # 1-based, of the opening brace


Part = str | Field


def _error(template: str, column: int, message: str) -> TemplateError:
    return TemplateError(f"template {template!r}: column {column}: {message}")


@lru_cache(maxsize=1024)
def parse_template(template: str) -> tuple[Part, ...]:
    """The literal text and fields of ``template``; raises TemplateError."""
    if not isinstance(template, str):
        raise TemplateError(f"a template must be a string, got {template!r}")
    parts: list[Part] = []
    text: list[str] = []
    i, n = 0, len(template)
    while i < n:
        char = template[i]
        if char == "}":
            if template.startswith("}}", i):
                text.append("}")
                i += 2
                continue
            raise _error(template, i + 1, "single '}' (write '}}' for a literal brace)")
        if char != "{":
            text.append(char)
            i += 1
            continue
        if template.startswith("{{", i):
            text.append("{")
            i += 2
            continue
        if text:
            parts.append("".join(text))
            text = []
        field, i = _parse_field(template, i)
        parts.append(field)
    if text:
        parts.append("".join(text))
    return tuple(parts)


def _parse_field(template: str, start: int) -> tuple[Field, int]:
    """The field opening at ``start`` (a ``{``) and the index after its ``}``."""
    i = start + 1
    name = _NAME.match(template, i)
    if name is None:
        if i >= len(template):
            raise _error(template, start + 1, "unclosed '{'")
        if template[i] == "}":
            raise _error(template, start + 1, "empty field '{}'" + _HINT)
        if template[i].isdigit():
            raise _error(template, i + 1, "positional fields are not allowed; start with a name")
        raise _error(template, i + 1, _unexpected(template, i))
    root = name.group()
    i = name.end()
    keys: list[str | int] = []
    while True:
        if i >= len(template):
            raise _error(template, start + 1, "unclosed '{'")
        char = template[i]
        if char == "}":
            return Field(root, tuple(keys), start + 1), i + 1
        if char != "[":
            raise _error(template, i + 1, _unexpected(template, i))
        key, i = _parse_key(template, i + 1)
        keys.append(key)
        if i >= len(template) or template[i] != "]":
            if i >= len(template):
                raise _error(template, start + 1, "unclosed '['")
            raise _error(template, i + 1, f"expected ']' after a key, got {template[i]!r}")
        i += 1


def _parse_key(template: str, i: int) -> tuple[str | int, int]:
    """A key starting at ``i`` (after ``[``) and the index after it."""
    if i < len(template) and template[i] in "'\"":
        quote, i, chars = template[i], i + 1, []
        while i < len(template) and template[i] != quote:
            if template[i] == "\\" and i + 1 < len(template):
                i += 1
            chars.append(template[i])
            i += 1
        if i >= len(template):
            raise _error(template, i, f"unclosed {quote} in a key")
        return "".join(chars), i + 1
    bare = _BARE.match(template, i)
    if bare is None:
        if i >= len(template):
            raise _error(template, i, "unclosed '['")
        raise _error(template, i + 1, _unexpected(template, i, "a key"))
    word = bare.group()
    # Kept as text: {input[007]} names the key "007"; an array lookup reads it as 7.
    return word, bare.end()


def _unexpected(template: str, i: int, expected: str = "'[' or '}'") -> str:
    char = template[i]
    if char in _FORBIDDEN:
        return _FORBIDDEN[char] + _HINT
    return f"unexpected {char!r}, expected {expected}" + _HINT


def _lookup(template: str, field: Field, scope: dict[str, Any]) -> Any:
    if field.root not in scope:
        names = " or ".join(sorted(scope))
        raise _error(template, field.column, f"unknown name {field.root!r} (expected {names})")
    value = scope[field.root]
    path = field.root
    for key in field.keys:
        if isinstance(value, dict):
            text = str(key)
            if text not in value:
                raise _error(template, field.column, f"{path} has no item {text!r}")
            value = value[text]
        elif isinstance(value, list):
            if isinstance(key, str) and _INTEGER.fullmatch(key):
                key = int(key)
            if not isinstance(key, int):
                raise _error(template, field.column, f"{path} is an array; {key!r} is no index")
            if not -len(value) <= key < len(value):
                raise _error(template, field.column, f"{path} has no item {key}")
            value = value[key]
        else:
            kind = type(value).__name__
            article = "an" if kind[0] in "aeiou" else "a"
            raise _error(
                template, field.column, f"{path} is {article} {kind}, not an object or array"
            )
        path += f"[{key!r}]"
    return value


def _text(template: str, field: Field, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return str(value)
    kind = "an object" if isinstance(value, dict) else f"a {type(value).__name__}"
    raise _error(template, field.column, f"the field is {kind}, expected a string or number")


def render(template: str, scope: dict[str, Any]) -> str:
    """``template`` with its fields replaced by text looked up in ``scope``."""
    out = []
    for part in parse_template(template):
        if isinstance(part, str):
            out.append(part)
        else:
            out.append(_text(template, part, _lookup(template, part, scope)))
    return "".join(out)


def resolve(template: Any, scope: dict[str, Any]) -> Any:
    """A template that is exactly one field gives the value itself (any JSON), other
    strings render to text, and non-strings are returned as they are."""
    if not isinstance(template, str):
        return template
    parts = parse_template(template)
    if len(parts) == 1 and isinstance(parts[0], Field):
        return _lookup(template, parts[0], scope)
    return render(template, scope)
