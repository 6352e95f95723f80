"""Guards run in bounded time: RE2 regexes, few recursive descents, a time budget."""

from __future__ import annotations

import time
from typing import Any

import pytest

from flowlang.compiler import compile_text
from flowlang.data import MAX_DESCENTS, GuardBudgetExceeded, guard_matches
from flowlang.errors import FlowSyntaxError
from flowlang.limits import GuardTimeout, Limits
from flowlang.machine import Machine, State
from flowlang.runner import run

CATASTROPHIC = '$[?(@.s =~ "^(a+)+$")]'  # exponential for a backtracking engine


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("guard", "value", "matches"),
    [
        ('$[?(@.s =~ "^ab")]', {"s": "abc"}, True),
        ('$[?(@.s =~ "^ab")]', {"s": "xab"}, False),
        ('$[?(@.s =~ "b+")]', {"s": "xabbb"}, True),  # a search, not a full match
        ('$[?(@.s =~ "^ab")]', {"s": 12}, False),  # only strings match
        ('$[?(@.s =~ "(?i)^AB")]', {"s": "abc"}, True),
        ("$.s.`sub(/b+/, X)`", {"s": "abbc"}, True),
        ("$.s.`sub(/z/, X)`", {"s": "abbc"}, False),
    ],
)
def test_regex_guards_keep_their_meaning_under_re2(guard: str, value: Any, matches: bool) -> None:
    assert guard_matches(guard, value) is matches


@pytest.mark.parametrize("length", [28, 100_000])
def test_a_catastrophic_regex_runs_in_linear_time(length: int) -> None:
    started = time.perf_counter()
    assert guard_matches(CATASTROPHIC, {"s": "a" * (length - 1) + "b"}) is False
    assert time.perf_counter() - started < 0.5  # Python's re: about 4 s at 28 characters


def test_a_regex_re2_cannot_run_is_a_compile_error_at_the_guard(capfd) -> None:
    with pytest.raises(FlowSyntaxError) as caught:
        compile_text('A\n  → ? `$[?(@.s =~ "(a)\\\\1")]` B', "g.flow")
    error = caught.value
    assert (error.line, error.column) == (2, 5)
    assert "is not supported: invalid escape sequence" in str(error)
    assert "RE2" in str(error)
    assert capfd.readouterr().err == ""  # RE2's own logging is off


def test_more_recursive_descents_than_the_limit_are_a_compile_error_at_the_guard() -> None:
    allowed = "..".join(["$"] + ["a"] * MAX_DESCENTS)
    compile_text(f"A → ? `{allowed}` B")
    with pytest.raises(FlowSyntaxError) as caught:
        compile_text(f"A → ? `{allowed}..a` B")
    assert (caught.value.line, caught.value.column) == (1, 5)
    assert f"has {MAX_DESCENTS + 1} recursive descents (..), more than {MAX_DESCENTS}" in str(
        caught.value
    )


def test_a_guard_past_its_budget_stops_soon_after() -> None:
    started = time.perf_counter()
    with pytest.raises(GuardBudgetExceeded):
        guard_matches("$..a..a..a", nested(250), budget_ms=50)
    assert time.perf_counter() - started < 1.0  # unbounded, the walk takes minutes


def test_repeating_a_string_or_list_in_a_guard_finds_nothing_instead_of_eating_memory() -> None:
    assert guard_matches("$.s * 1000000000000", {"s": "ab"}) is False
    assert guard_matches("$.s * 1000000000000", {"s": [1]}) is False
    assert guard_matches("$[?(@.n * 2 = 6)]", {"n": 3}) is True  # numbers still multiply


def test_the_machine_raises_guard_timeout_at_the_guarded_step() -> None:
    machine = Machine(compile_text("A\n  → ? `$..a..a..a` B"), Limits(guard_ms=20))
    state = State()
    [start] = machine.start(state)
    with pytest.raises(GuardTimeout) as caught:
        machine.task_ended(state, start.key, start.attempt, nested(250))
    error = caught.value
    assert (error.line, error.column) == (2, 20)  # the guarded step (the graph keeps no more)
    assert "B (2): guard `$..a..a..a` took more than 20 ms on its input" in str(error)


def test_the_runner_fails_the_workflow_with_the_guard_timeout() -> None:
    result = run(
        compile_text("A → ? `$..a..a..a` B"), lambda call: nested(250), limits=Limits(guard_ms=20)
    )
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith("1:20: B (2): guard")
    assert result.names() == ["A"]
