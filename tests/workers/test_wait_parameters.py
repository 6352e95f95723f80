"""Reading what a wait: task asks for: durations, event waits, latch names (no Redis)."""

from __future__ import annotations

from typing import Any

import pytest

from workers.errors import WaitParameterError
from workers.task import Task
from workers.waitspec import Delay, EventWait, Latch, parse_duration, wait_spec


def task(name: str, parameters: dict[str, Any], input: Any = None) -> Task:
    return Task("w", name, 1, "1", 1, "w/1/1", input, parameters)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (60, 60.0),
        (2.5, 2.5),
        ("60", 60.0),
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1d", 86400.0),
        (" 2 m ", 120.0),
        (0, 0.0),
    ],
)
def test_durations_are_seconds_or_numbers_with_units(value: Any, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "-1", -3, True, None, "", "1h-5m", [1]])
def test_anything_else_is_not_a_duration(value: Any) -> None:
    with pytest.raises(WaitParameterError, match="duration"):
        parse_duration(value)


def test_each_wait_operation_reads_its_parameters() -> None:
    assert wait_spec(task("wait:delay", {"duration": "5m"})) == Delay(300.0)
    assert wait_spec(task("wait:event", {"event": "go"})) == EventWait("go", None, True)
    matched = wait_spec(task("wait:event", {"event": "go", "match": "input"}, {"a": 1}))
    assert matched == EventWait("go", {"a": 1}, True)
    latch = wait_spec(task("wait:acquire", {"name": 'l-{input["id"]}'}, {"id": 2}))
    assert latch == Latch("acquire", "l-2")


@pytest.mark.parametrize(
    ("name", "parameters", "message"),
    [
        ("wait:delay", {}, "parameter 'duration' is missing"),
        ("wait:event", {"event": "go", "match": "input"}, "'match: input' needs an object input"),
        ("wait:event", {"event": "go", "match": 3}, "expected 'input' or an object"),
        ("wait:event", {"event": "go", "receipt": "yes"}, "not a boolean"),
        ("wait:countdown", {"name": ""}, "parameter 'name' must be a non-empty string"),
        ("wait:sleep", {}, "expected wait:delay, wait:event, wait:acquire"),
    ],
)
def test_bad_wait_parameters_are_reported_with_the_task_name(
    name: str, parameters: dict[str, Any], message: str
) -> None:
    with pytest.raises(WaitParameterError) as caught:
        wait_spec(task(name, parameters, [1]))
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("name", "parameters"),
    [
        ("wait:acquire", {"name": "latch-{input[s]}"}),
        ("wait:event", {"event": "{input[s]}"}),
        ("wait:event", {"event": "go", "channel": "c-{input[s]}"}),
    ],
)
def test_a_name_that_renders_past_the_limit_is_a_parameter_error(
    name: str, parameters: dict[str, Any]
) -> None:
    with pytest.raises(WaitParameterError, match=r"renders to 5,00\d characters, more than 1,024"):
        wait_spec(task(name, parameters, {"s": "x" * 5000}))


def test_a_channel_is_a_rendered_name() -> None:
    spec = wait_spec(task("wait:event", {"event": "go", "channel": "orders-{input[r]}"}, {"r": 7}))
    assert spec == EventWait("go", None, True, "orders-7")
    with pytest.raises(WaitParameterError, match="'channel' must be a non-empty string"):
        wait_spec(task("wait:event", {"event": "go", "channel": 5}))
