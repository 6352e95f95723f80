"""The event schema's parsers: the quick path for the engine's own end-tasks agrees with
the full validation on every event."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from lifecycle.errors import BadEvent
from lifecycle.events import _parse_end_task, end_task, parse_end_task

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=5,
)
_fields = {
    "workflow": _json | st.text(max_size=5),
    "key": _json | st.sampled_from(["1", "2.0"]),
    "index": _json,
    "attempt": _json | st.integers(1, 3),
    "status": _json | st.sampled_from(["SUCCESS", "FAILURE", "success", "odd"]),
    "output": _json,
    "error": _json,
    "worker": _json | st.text(max_size=5),
}
_anything = st.fixed_dictionaries(
    {"kind": st.just("end-task")},
    optional=_fields,  # type: ignore[arg-type]
)
# As the engine writes them, but for what may vary: most take the quick path.
_engine_like = st.fixed_dictionaries(
    {
        "kind": st.just("end-task"),
        "workflow": st.text(max_size=5),
        "key": st.text(max_size=4),
        "attempt": st.integers(0, 3) | st.booleans(),
        "status": st.sampled_from(["SUCCESS", "SUCCESS", "FAILURE", "success"]),
    },
    optional={"output": _json, "error": _json, "worker": _json | st.text(max_size=5)},
)
_events = _anything | _engine_like


def _outcome(parse: Any, event: dict[str, Any]) -> Any:
    try:
        return parse("1-0", event)
    except BadEvent as error:
        return str(error)


@given(_events)
def test_any_end_task_parses_as_the_full_validation_parses_it(event: dict[str, Any]) -> None:
    assert _outcome(parse_end_task, event) == _outcome(_parse_end_task, event)


def test_the_engines_own_end_tasks_parse_to_what_they_say() -> None:
    start = {"workflow": "w1", "key": "3.1", "attempt": 2}
    parsed = parse_end_task("1-0", end_task(start, {"n": 1}, worker="w0"))
    assert (parsed.workflow, parsed.key, parsed.attempt) == ("w1", "3.1", 2)
    assert (parsed.success, parsed.output, parsed.error, parsed.worker) == (
        True,
        {"n": 1},
        None,
        "w0",
    )
    failed = parse_end_task("1-0", end_task(start, error="boom"))
    assert (failed.success, failed.error, failed.output) == (False, "boom", None)
