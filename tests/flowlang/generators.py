"""Hypothesis settings and flow generators shared by the flowlang property tests.

``FUZZ`` is the ``flowlang-fuzz`` profile, registered here once: examples per
property from ``FLOWLANG_FUZZ_EXAMPLES`` (default 200, the CI size), no
deadline (parse time varies with size). ``valid_flows`` draws flow texts
(cycles, guards, iterations, subflows, literals, declarations) as :class:`Part`
values that also carry the nodes each must compile to.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any

import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from flowlang.graph import NodeKind

EXAMPLES = int(os.environ.get("FLOWLANG_FUZZ_EXAMPLES", "200"))
settings.register_profile(
    "flowlang-fuzz",
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings.get_profile("flowlang-fuzz")

FILE = "fuzz.flow"


# A node's signature: what the text says it is, whatever its id (the merge flag
# is left out: a `> :x` target sets it on the label's readers).
Signature = tuple[str, str | None, bool, str | None, str]

NAMES = ["A", "B2", "_x", "my:peel-banana", "wait:delay", "T-9", "a_b:c-d", "F:end", "start", "S"]
DECLARATIONS = "@task X = A (- fruit: banana -);\n@task Y '''inlined''' { A → B };\n"
PARAMS: list[tuple[str, Any]] = [
    ("", None),
    (" (- a: 1 -)", {"a": 1}),
    ("(- fruit: [apple, kiwi] -)", {"fruit": ["apple", "kiwi"]}),
    (' ({"b": "q\\"uote"})', {"b": 'q"uote'}),
    (" ([1, {}])", [1, {}]),
    (" ()", {}),
]
GUARDS = [
    *[None, None, None, "$.a", "$[?(@.s=0)]", "$.items[0]"],
    *['$[?(@.s =~ "^(a+)+$")]', "$..a..a", "$[?(@.n * 2 = 4)]"],  # work a guard must bound
]
SOURCES: list[tuple[str, str | None, Any]] = [
    ("<data.json>", "data.json", None),
    ("<http://h/p?q=1>(- method: GET -)", "http://h/p?q=1", {"method": "GET"}),
    ('<{"k": 1}>', None, {"k": 1}),
    ("<[1, 2]>", None, [1, 2]),
    ("<>", None, {}),
    ("<- a: 1 ->", None, {"a": 1}),
]
SINKS: list[tuple[str, str, Any]] = [
    ("<out.json>", "out.json", None),
    ("<s3://b/k.json>(- acl: private -)", "s3://b/k.json", {"acl": "private"}),
]
ARROWS = ["→", " → ", "->", " -> ", "\n  → ", " →\n"]
MAX_DEPTH = 3
ENDS_WITH_LABEL = re.compile(r"(?<![\w:-]):[A-Za-z_][\w-]*\s*$")  # `:x`, not the `:end` of `F:end`


def signature(
    kind: NodeKind, name: str | None, iterate: bool, guard: str | None, params: Any
) -> Signature:
    return (
        str(kind),
        name,
        iterate,
        guard,
        orjson.dumps(params, option=orjson.OPT_SORT_KEYS).decode(),
    )


class Part:
    """Generated flow text and the nodes it must compile to."""

    def __init__(self, text: str, nodes: Counter[Signature] | None = None) -> None:
        self.text = text
        self.nodes = nodes if nodes is not None else Counter()

    def __repr__(self) -> str:
        return f"Part({self.text!r})"

    def __add__(self, other: Part) -> Part:
        return Part(self.text + other.text, self.nodes + other.nodes)


@st.composite
def task(draw: st.DrawFn, declared: bool, iterate: bool = False, guard: str | None = None) -> Part:
    name = draw(st.sampled_from(NAMES + (["X", "Y"] if declared else [])))
    if name == "Y":  # an inlined body: a named subflow around A → B
        part = Part("Y", Counter([signature(NodeKind.SUBFLOW_START, "Y", iterate, guard, None)]))
        return part + Part(
            "", Counter(signature(NodeKind.TASK, t, False, None, None) for t in "AB")
        )
    text, params = draw(st.sampled_from(PARAMS))
    if name == "X":  # an alias of A with default parameters; an array would clash
        if isinstance(params, list):
            text, params = "", None
        name, params = "A", {"fruit": "banana", **(params or {})}
        text = "X" + text
    else:
        text = name + text
    return Part(text, Counter([signature(NodeKind.TASK, name, iterate, guard, params)]))


@st.composite
def step(draw: st.DrawFn, depth: int, declared: bool) -> Part:
    modifier = draw(st.sampled_from(["", "", "* ", "> "]))
    guard = draw(st.sampled_from(GUARDS))
    prefix = modifier + (f"? `{guard}` " if guard else "")
    iterate = modifier == "* "
    kinds = ["task"] * 4 + ["fan"] + (["subflow"] if depth < MAX_DEPTH else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "task":
        return Part(prefix) + draw(task(declared, iterate, guard))
    start = Part("", Counter([signature(NodeKind.SUBFLOW_START, None, iterate, guard, None)]))
    if kind == "fan":
        members = draw(st.lists(task(declared), min_size=2, max_size=4))
        body = Part("|".join(m.text for m in members), sum((m.nodes for m in members), Counter()))
        return Part(prefix) + start + body
    inner = draw(scope(depth + 1, declared))
    return Part(prefix + "{ ") + start + inner + Part(" }")


@st.composite
def chain(draw: st.DrawFn, depth: int, declared: bool) -> list[Part]:
    return draw(st.lists(step(depth, declared), min_size=1, max_size=3 if depth == 0 else 2))


@st.composite
def plain_statement(draw: st.DrawFn, depth: int, declared: bool) -> Part:
    head: list[Part] = []
    if draw(st.booleans()):
        text, uri, value = draw(st.sampled_from(SOURCES))
        head = [Part(text, Counter([signature(NodeKind.SOURCE, uri, False, None, value)]))]
    elif draw(st.booleans()):
        head = [Part(":start")]
    steps = head + draw(chain(depth, declared))
    ending = draw(st.sampled_from(["", "sink", ":end", "> :end"]))
    if ending == "sink":
        text, uri, value = draw(st.sampled_from(SINKS))
        steps.append(Part(text, Counter([signature(NodeKind.SINK, uri, False, None, value)])))
    elif ending:
        steps.append(Part(ending))
    return join(draw, steps)


def join(draw: st.DrawFn, steps: list[Part]) -> Part:
    joined = steps[0]
    for part in steps[1:]:
        joined = joined + Part(draw(st.sampled_from(ARROWS))) + part
    return joined


@st.composite
def stitched(draw: st.DrawFn, depth: int, declared: bool, label: str) -> list[Part]:
    """Statements joined by one label, in one of the forms FLOWLANG.md lists."""
    x = Part(f" :{label}")
    form = draw(st.integers(0, 4))
    a, b, c = (draw(chain(depth, declared)) for _ in range(3))
    if form == 0:  # A :x → B; :x → C   (a fork)
        return [join(draw, [*a[:-1], a[-1] + x, *b]), join(draw, [Part(f":{label}"), *c])]
    if form == 1:  # A → :x; B → > :x; :x C   (a meet read by an input label)
        target = Part(draw(st.sampled_from(["", "> "])) + f":{label}")
        reader = join(draw, [Part(f":{label} ") + c[0], *c[1:]])
        return [join(draw, [*a, target]), join(draw, [*b, Part(f":{label}")]), reader]
    if form == 2:  # A → :x C; B → :x
        return [
            join(draw, [*a, Part(f":{label} ") + c[0], *c[1:]]),
            join(draw, [*b, Part(f":{label}")]),
        ]
    if form == 3:  # :x → A → B; C → :x
        return [join(draw, [Part(f":{label}"), *a]), join(draw, [*c, Part(f":{label}")])]
    # A :x → B → :x C   (one label out and back in within a statement)
    return [join(draw, [*a[:-1], a[-1] + x, *b, Part(f":{label} ") + c[0], *c[1:]])]


@st.composite
def scope(draw: st.DrawFn, depth: int, declared: bool) -> Part:
    # Smaller scopes deeper down keep the flows at a few dozen steps.
    statements = draw(st.lists(plain_statement(depth, declared), max_size=3 if depth == 0 else 2))
    for number in range(draw(st.integers(0, 2 if depth == 0 else 1))):
        statements.extend(
            draw(stitched(depth, declared, f"x{number}"))
        )  # same names in every scope
    if not statements:
        statements = [draw(plain_statement(depth, declared))]
    statements = draw(st.permutations(statements))
    text = statements[0]
    for previous, statement in zip(statements, statements[1:], strict=False):
        text = text + Part(separator(draw, previous.text, statement.text)) + statement
    return text


def separator(draw: st.DrawFn, previous: str, following: str) -> str:
    """`;` where the next statement would read as a continuation, else any separator."""
    if following.lstrip().startswith(":") or ENDS_WITH_LABEL.search(previous):
        return draw(st.sampled_from([";", " ; ", ";\n"]))
    return draw(st.sampled_from([";", "\n", " ", ";\n", "\n\n# a comment\n"]))


@st.composite
def valid_flows(draw: st.DrawFn) -> Part:
    declared = draw(st.booleans())
    body = draw(scope(0, declared))
    if not declared:
        return body
    return Part(DECLARATIONS) + body if draw(st.booleans()) else body + Part(";\n" + DECLARATIONS)
