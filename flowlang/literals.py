"""Parameter and resource literals: YAML (safe loader only) and JSON bodies.

A literal's value is a JSON object or array; an empty literal is ``{}``. YAML
is read with ``yaml.safe_load``, so tags that build Python objects
(``!!python/object/apply:os.system``) are rejected, and the result is passed
through JSON so that what the graph holds is exactly what JSON can carry.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import yaml

from flowlang.errors import FlowLiteralError
from flowlang.limits import DEFAULT_LIMITS, LimitExceeded, Limits

# Length of the opening delimiter of each literal token type, so that error
# positions inside a body point at the right column.
_OPENERS = {
    "PARAMS_YAML": ("(-", "-)", "yaml"),
    "PARAMS_OBJECT": ("({", "})", "object"),
    "PARAMS_ARRAY": ("([", "])", "array"),
    "PARAMS_EMPTY": ("(", ")", "empty"),
    "RESOURCE_YAML": ("<-", "->", "yaml"),
    "RESOURCE_OBJECT": ("<{", "}>", "object"),
    "RESOURCE_ARRAY": ("<[", "]>", "array"),
    "RESOURCE_EMPTY": ("<", ">", "empty"),
}


def parse_literal(token_type: str, text: str, line: int, column: int) -> Any:
    """Parse the literal token ``text`` that starts at ``line:column``."""
    opener, closer, form = _OPENERS[token_type]
    body = text[len(opener) : len(text) - len(closer)]
    if form == "empty":
        return {}
    if form == "yaml":
        value = _load_yaml(body, line, column + len(opener))
        if value is None:
            return {}
    else:
        # The delimiters ({ } or [ ]) are part of the JSON text.
        value = _load_json(opener[1] + body + closer[0], line, column + 1)
    if not isinstance(value, dict | list):
        raise FlowLiteralError(
            f"a literal must be an object or an array, got {type(value).__name__} {value!r}",
            line,
            column,
        )
    return _as_json(value, line, column)


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses documents whose aliases expand past a budget.

    An alias is a reference, so a 400-byte document of nested aliases is a few
    nodes in memory but billions once converted to JSON (an alias bomb). The
    composed node graph is measured as JSON would expand it before anything is built.
    """

    budget = DEFAULT_LIMITS.yaml_aliases

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            _check_expansion(node, self.budget)
        return node


def _check_expansion(root: Any, aliases: int) -> None:
    # Expanded size of each node, memoised by identity: an alias is the same node object
    # met again, so sizes add up as JSON would repeat them.
    limit = max(aliases, 1) * 1000
    size: dict[int, int] = {}
    seen_twice = 0
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in size and not children_done:
            seen_twice += 1
            if seen_twice > aliases:
                raise LimitExceeded(f"YAML uses aliases more than {aliases} times")
            continue
        children = _children(node)
        if children_done or not children:
            size[key] = 1 + sum(size.get(id(child), 1) for child in children)
            if size[key] > limit:
                raise LimitExceeded(f"YAML aliases expand to more than {limit:,} nodes")
            continue
        size.setdefault(key, 1)  # a node that contains itself counts once more per visit
        stack.append((node, True))
        stack.extend((child, False) for child in children)


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def safe_yaml(text: str | bytes, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Load one YAML document with the safe loader, refusing alias expansion past
    ``limits.yaml_aliases``. Raises ``yaml.YAMLError`` or :class:`LimitExceeded`."""
    loader = _BoundedLoader(text)
    loader.budget = limits.yaml_aliases
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _load_yaml(body: str, line: int, column: int) -> Any:
    try:
        return safe_yaml(body)
    except LimitExceeded as error:
        raise FlowLiteralError(f"invalid YAML literal: {error.message}", line, column) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where_line, where_column = line, column
        if mark is not None:
            where_line = line + mark.line
            where_column = (column + mark.column) if mark.line == 0 else mark.column + 1
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise FlowLiteralError(
            f"invalid YAML literal: {problem}", where_line, where_column
        ) from None


def _load_json(text: str, line: int, column: int) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as error:
        where_line = line + error.lineno - 1
        where_column = (column + error.colno - 1) if error.lineno == 1 else error.colno
        raise FlowLiteralError(
            f"invalid JSON literal: {error.msg}", where_line, where_column
        ) from None


def _as_json(value: Any, line: int, column: int) -> Any:
    """Normalise YAML extras (dates, integer keys) to what JSON carries."""
    try:
        return orjson.loads(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS))
    except (TypeError, orjson.JSONEncodeError) as error:
        raise FlowLiteralError(
            f"literal value cannot be represented as JSON: {error}", line, column
        ) from None


def dumps_compact(value: Any) -> str:
    """A literal rendered back as compact JSON text (for messages and drawings)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
