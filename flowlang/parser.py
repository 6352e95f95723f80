"""Text → :class:`flowlang.ast.Flow`.

The grammar is ``flow.lark`` (LALR(1), so parsing is linear in the text); a
Lark ``Transformer`` turns the parse tree into frozen AST nodes, and Lark's
errors become :class:`FlowSyntaxError` with the line and column of the
offending token.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from flowlang import ast
from flowlang.data import DataError, compile_guard
from flowlang.errors import FlowDeclarationError, FlowError, FlowStructureError, FlowSyntaxError
from flowlang.limits import DEFAULT_LIMITS, LimitExceeded, Limits
from flowlang.literals import parse_literal

__all__ = ["parse"]

# What each terminal is called in an error message.
_TERMINAL_NAMES = {
    "ARROW": "an arrow",
    "NAME": "a task name",
    "LABEL": "a label",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "STAR": "'*'",
    "MERGE": "'>'",
    "PIPE": "'|'",
    "GUARD": "a guard",
    "URI": "a resource",
    "DECLARE": "a declaration",
    "SEMICOLON": "';'",
    "EQUAL": "'='",
    "DOC": "a doc string",
    "RESOURCE_YAML": "a resource literal",
    "RESOURCE_OBJECT": "a resource literal",
    "RESOURCE_ARRAY": "a resource literal",
    "RESOURCE_EMPTY": "a resource literal",
    "PARAMS_YAML": "a parameter literal",
    "PARAMS_OBJECT": "a parameter literal",
    "PARAMS_ARRAY": "a parameter literal",
    "PARAMS_EMPTY": "a parameter literal",
    "$END": "the end of the file",
}


@cache
def _parser() -> Lark:
    return Lark.open(
        "flow.lark",
        rel_to=__file__,
        parser="lalr",
        propagate_positions=False,
        maybe_placeholders=False,
    )


def parse(text: str, file: str | None = None, limits: Limits = DEFAULT_LIMITS) -> ast.Flow:
    """Parse flow text. Raises :class:`FlowError` (with ``file`` attached) on any error,
    :class:`LimitExceeded` for a text of more than ``limits.flow_bytes`` bytes (UTF-8)."""
    if len(text) * 4 > limits.flow_bytes:  # else even 4 bytes a character fit
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > limits.flow_bytes:
            raise LimitExceeded(
                f"the flow text is {size:,} bytes, more than the limit of {limits.flow_bytes:,}"
            ).located(file)
    try:
        tree = _parser().parse(text)
        return _ToAst().transform(tree)
    except UnexpectedInput as error:
        raise _syntax_error(error, text).located(file) from None
    except FlowError as error:
        raise error.located(file) from None
    except RecursionError:
        raise _too_deep().located(file) from None
    except Exception as error:  # a FlowError wrapped by Lark's transformer
        inner = getattr(error, "orig_exc", None)
        if isinstance(inner, FlowError):
            raise inner.located(file) from None
        if isinstance(inner, RecursionError):
            raise _too_deep().located(file) from None
        raise


def _too_deep() -> FlowStructureError:
    return FlowStructureError(
        "subflows are nested too deeply for this Python's recursion limit (about 150 levels)", 1, 1
    )


def _describe(token: Token) -> str:
    if token.type == "$END":
        return "end of file"
    name = _TERMINAL_NAMES.get(token.type, token.type.lower())
    if name.startswith("'"):
        return name
    name = name.removeprefix("a ").removeprefix("an ")  # "unexpected guard", not "a guard"
    value = str(token)
    if len(value) > 30:
        value = value[:27] + "..."
    return f"{name} {value!r}"


def _expected(names: set[str]) -> str:
    described = sorted({_TERMINAL_NAMES.get(n, n.lower()) for n in names if not n.startswith("__")})
    return ", ".join(described) if described else "something else"


def _syntax_error(error: UnexpectedInput, text: str) -> FlowSyntaxError:
    if isinstance(error, UnexpectedCharacters):
        at = error.pos_in_stream if error.pos_in_stream is not None else len(text)
        char = text[at] if at < len(text) else ""
        hint = ""
        if char == "(":
            hint = " (parameter literals are (- yaml -), ({json}), ([json]) or ())"
        elif char == "<":
            hint = " (resources are <uri>, <- yaml ->, <{json}>, <[json]> or <>)"
        elif char == "`":
            hint = " (a guard is written ? `jsonpath`)"
        return FlowSyntaxError(f"unexpected character {char!r}{hint}", error.line, error.column)
    if isinstance(error, UnexpectedToken):
        token = error.token
        if token.type == "$END":
            return _end_error(error, text)
        expected = set(error.expected)
        if token.type == "ARROW":
            if "ARROW" in expected or expected <= {"SEMICOLON", "ARROW"}:
                message = "stray arrow: nothing can follow here"
            else:
                message = "stray arrow: expected a step before it"
        elif token.type == "RBRACE":
            message = "unexpected '}' (no subflow to close)"
        else:
            message = f"unexpected {_describe(token)} (expected {_expected(expected)})"
        return FlowSyntaxError(message, token.line, token.column)
    if isinstance(error, UnexpectedEOF):
        return _end_error(error, text)
    return FlowSyntaxError(str(error), getattr(error, "line", 0), getattr(error, "column", 0))


def _end_error(error: UnexpectedInput, text: str) -> FlowSyntaxError:
    # Lines are counted as Lark counts them: by "\n" only.
    content = text.rstrip()
    line = content.count("\n") + 1
    last_line = content[content.rfind("\n") + 1 :]
    column = len(last_line) + 1
    expected = set(getattr(error, "expected", ()) or ())
    if "RBRACE" in expected and "NAME" in expected:
        message = "unexpected end of file: a '{' is never closed"
    elif content.endswith(("→", "->")):
        message = "stray arrow: the statement ends with an arrow"
        column -= 1 if content.endswith("→") else 2
    else:
        message = f"unexpected end of file (expected {_expected(expected)})"
    return FlowSyntaxError(message, line, column)


def _pos(token: Token) -> ast.Pos:
    return ast.Pos(token.line or 0, token.column or 0)


def _literal(token: Token) -> ast.Literal:
    value = parse_literal(token.type, str(token), token.line or 0, token.column or 0)
    return ast.Literal(value, _pos(token))


def _guard_text(token: Token) -> str:
    """The JSONPath of a ``? `...` `` token, checked now so a typo fails at compile time."""
    text = str(token)
    expression = text[text.index("`") + 1 : -1].strip()
    try:
        compile_guard(expression)
    except DataError as error:
        raise FlowSyntaxError(str(error), token.line or 0, token.column or 0) from None
    return expression


@v_args(inline=True)
class _ToAst(Transformer[Token, ast.Flow]):
    """Parse tree → AST. Methods are named after grammar rules and aliases."""

    def start(self, *items: Any) -> ast.Flow:
        statements: list[ast.Statement] = []
        flow_decl: ast.FlowDeclaration | None = None
        tasks: dict[str, ast.TaskDeclaration] = {}
        for item in items:
            if isinstance(item, ast.Statement):
                statements.append(item)
            elif isinstance(item, ast.FlowDeclaration):
                if flow_decl is not None:
                    raise FlowDeclarationError(
                        f"second @flow declaration (the first is at {flow_decl.pos})",
                        item.pos.line,
                        item.pos.column,
                    )
                flow_decl = item
            else:
                if item.name in tasks:
                    raise FlowDeclarationError(
                        f"task {item.name!r} declared twice (first at {tasks[item.name].pos})",
                        item.pos.line,
                        item.pos.column,
                    )
                tasks[item.name] = item
        if not statements:
            bodies = [t for t in tasks.values() if t.body is not None]
            hint = ""
            if bodies:
                last = bodies[-1]
                hint = (
                    f" (the '{{ ... }}' after @task {last.name} at {last.pos} is read as its body;"
                    " end the declaration with ';' to make it a statement)"
                )
            raise FlowStructureError("the flow has no statement" + hint, 1, 1)
        return ast.Flow(tuple(statements), flow_decl, tasks)

    def declaration(self, keyword: Token, name: Token, *rest: Any) -> Any:
        pos = _pos(keyword)
        alias = next((r for r in rest if isinstance(r, _Alias)), None)
        params = next((r for r in rest if isinstance(r, ast.Literal)), None)
        doc = next((r for r in rest if isinstance(r, _Doc)), None)
        body = next((r for r in rest if isinstance(r, ast.Subflow)), None)
        kind = keyword[1:]
        if kind == "flow":
            if alias is not None or body is not None:
                what = "an alias" if alias is not None else "a body"
                raise FlowDeclarationError(f"@flow cannot have {what}", pos.line, pos.column)
            return ast.FlowDeclaration(str(name), params, doc.text if doc else None, pos)
        if kind != "task":
            raise FlowDeclarationError(
                f"unknown declaration {str(keyword)!r} (expected @flow or @task)",
                pos.line,
                pos.column,
            )
        if alias is not None and body is not None:
            raise FlowDeclarationError(
                f"@task {name} has both an alias and a body (choose one)", pos.line, pos.column
            )
        return ast.TaskDeclaration(
            str(name),
            pos,
            alias=alias.name if alias else None,
            params=params,
            doc=doc.text if doc else None,
            body=body,
        )

    def alias(self, name: Token) -> _Alias:
        return _Alias(str(name))

    def doc(self, token: Token) -> _Doc:
        return _Doc(str(token)[3:-3].strip())

    def params(self, token: Token) -> ast.Literal:
        return _literal(token)

    def statement(self, head: Any, *rest: Any) -> ast.Statement:
        steps = tuple(r for r in rest if isinstance(r, ast.Step))
        target = next((r for r in rest if isinstance(r, ast.LabelTarget | ast.SinkTarget)), None)
        pos = head.pos if not isinstance(head, ast.Label) else head.pos
        return ast.Statement(head, steps, target, pos)

    def head_step(self, step: ast.Step) -> ast.Step:
        return step

    def head_label(self, token: Token) -> ast.Label:
        return ast.Label(str(token)[1:], _pos(token))

    def head_source(self, source: Any) -> Any:
        return source

    def uri_source(self, uri: Token, params: ast.Literal | None = None) -> ast.UriResource:
        return ast.UriResource(str(uri)[1:-1], params, _pos(uri))

    def literal_source(self, token: Token) -> ast.LiteralSource:
        return ast.LiteralSource(_literal(token).value, _pos(token))

    def uri(self, token: Token) -> Token:
        return token

    def target_label(self, *tokens: Token) -> ast.LabelTarget:
        label = tokens[-1]
        return ast.LabelTarget(ast.Label(str(label)[1:], _pos(label)), merge=len(tokens) == 2)

    def target_sink(self, *items: Any) -> ast.SinkTarget:
        merge = isinstance(items[0], Token) and items[0].type == "MERGE"
        rest = items[1:] if merge else items
        uri: Token = rest[0]
        params = rest[1] if len(rest) > 1 else None
        return ast.SinkTarget(ast.UriResource(str(uri)[1:-1], params, _pos(uri)), merge=merge)

    def modifier(self, token: Token) -> Token:
        return token

    def step(self, *items: Any) -> ast.Step:
        input_label = output_label = None
        iterate = merge = False
        guard = None
        body: ast.Task | ast.Subflow | None = None
        pos: ast.Pos | None = None
        for item in items:
            if isinstance(item, Token):
                if pos is None:
                    pos = _pos(item)
                if item.type == "LABEL":
                    label = ast.Label(str(item)[1:], _pos(item))
                    if body is None:
                        input_label = label
                    else:
                        output_label = label
                elif item.type == "STAR":
                    iterate = True
                elif item.type == "MERGE":
                    merge = True
                elif item.type == "GUARD":
                    guard = _guard_text(item)
            else:
                body = item
                if pos is None:
                    pos = item.pos
        assert body is not None and pos is not None
        return ast.Step(body, body.pos, input_label, output_label, iterate, merge, guard)

    def task(self, name: Token, params: ast.Literal | None = None) -> ast.Task:
        return ast.Task(str(name), params, _pos(name))

    def fan(self, *items: Any) -> ast.Subflow:
        tasks = [t for t in items if isinstance(t, ast.Task)]
        statements = tuple(ast.Statement(ast.Step(t, t.pos), (), None, t.pos) for t in tasks)
        return ast.Subflow(statements, tasks[0].pos, tasks[-1].pos, fan=True)

    def subflow(self, lbrace: Token, *items: Any) -> ast.Subflow:
        rbrace: Token = items[-1]
        statements = tuple(i for i in items[:-1] if isinstance(i, ast.Statement))
        if any(not isinstance(i, ast.Statement) for i in items[:-1]):
            raise FlowDeclarationError(
                "declarations are only allowed at the top level, not inside a subflow",
                lbrace.line or 0,
                lbrace.column or 0,
            )
        if not statements:
            raise FlowStructureError("empty subflow '{ }'", lbrace.line or 0, lbrace.column or 0)
        return ast.Subflow(statements, _pos(lbrace), _pos(rbrace))


class _Alias:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Doc:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text
