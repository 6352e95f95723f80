"""The Redis engine and flowlang's in-memory runner agree on generated flows.

Flows are built from chains, fan-out/fan-in subflows (nested), labels that
join statements, guards, iteration over lists of 0–2 items (tasks and
subflows), merges and declaration defaults. One deterministic task
implementation serves both executions. CI runs a modest number of examples;
``LIFECYCLE_EQUIVALENCE_EXAMPLES=2000`` is the full run.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import orjson
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall, run
from lifecycle.engine.store import load_workflow
from tests.lifecycle.harness import Harness

EXAMPLES = int(os.environ.get("LIFECYCLE_EQUIVALENCE_EXAMPLES", "150"))


def digest(*values: Any) -> int:
    text = orjson.dumps(values, option=orjson.OPT_SORT_KEYS)
    return int.from_bytes(hashlib.sha256(text).digest()[:4], "big")


def task(call: TaskCall) -> Any:
    """Deterministic: L tasks output a list of 0–2 items, others an object with a coin."""
    h = digest(call.name, call.input, call.params)
    if call.name.startswith("L"):
        return [{"i": i, "h": h % 97} for i in range(h % 3)]
    return {"t": call.name, "h": h % 1000, "go": h % 2 == 0}


names = st.sampled_from(["T1", "T2", "T3", "x:T4", "P"])
params = st.sampled_from(["", " (- {k: 1} -)", ' ({"k": 2, "j": [1]})', " ()"])
guards = st.sampled_from(["", "? `$[?(@.go=true)]` ", "? `$.h` "])


def plain_step(draw: Any, depth: int) -> str:
    kind = draw(st.integers(0, 5 if depth < 2 else 2))
    guard = draw(guards)
    if kind <= 2:
        return f"{guard}{draw(names)}{draw(params)}"
    if kind == 3:
        return f"{guard}{draw(names)}|{draw(names)}"
    if kind == 4:
        return "L → * " + guard + draw(st.sampled_from(["T1", "x:T4"]))
    inner = " ".join(draw(chains(depth + 1)) for _ in range(draw(st.integers(1, 3))))
    star = draw(st.sampled_from(["", "L → * "]))
    return f"{star}{guard}{{ {inner} }}"


@st.composite
def chains(draw: Any, depth: int = 0) -> str:
    steps = [plain_step(draw, depth) for _ in range(draw(st.integers(1, 3)))]
    merge = draw(st.sampled_from(["", "> "]))
    if len(steps) > 1:
        steps[-1] = merge + steps[-1]
    return " → ".join(steps) + ";"


@st.composite
def flows(draw: Any) -> str:
    statements = [draw(chains()) for _ in range(draw(st.integers(1, 3)))]
    if draw(st.booleans()):  # stitch a join through a label
        statements.append("J :j → T2; :j → T3;")
    header = draw(
        st.sampled_from(["", "@task P (- {p: 1, k: 0} -);\n", "@flow f (- {seed: 3} -);\n"])
    )
    return header + "\n".join(statements)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=flows(), seed=st.integers(0, 3))
def test_engine_and_runner_agree(harness: Harness, text: str, seed: int) -> None:
    _assert_agree(harness, text, seed)


def _assert_agree(harness: Harness, text: str, seed: int) -> None:
    graph = compile_text(text)
    expected = run(graph, task, {"seed": seed})
    workflow = harness.submit(graph, {"seed": seed})
    harness.pump(task)
    record = load_workflow(harness.client, harness.keys, workflow)
    assert (record.status, record.output, record.error) == (
        expected.status,
        expected.output,
        expected.error,
    ), text


@settings(
    max_examples=max(EXAMPLES // 3, 1),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=flows(), seed=st.integers(0, 3))
def test_engine_with_packed_start_tasks_and_runner_agree(
    redis_client: redis.Redis, text: str, seed: int
) -> None:
    redis_client.flushdb()
    _assert_agree(Harness(redis_client, pack_starts=True), text, seed)
