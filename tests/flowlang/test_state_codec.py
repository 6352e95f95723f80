"""A stored state decodes to the same State whichever path decodes it."""

from __future__ import annotations

from typing import Any

import pytest

from flowlang.state import State


@pytest.mark.parametrize(
    "data",
    [
        {"status": "running", "running": {"3": 1}},
        {"status": "failed", "running": {"3": 2, "4.0": 1}},
        {"status": "running", "running": {"3": 1}, "attempts": {"3": [1, 2]}},
        {"running": {"3": 1}, "output": {"x": 1}},
        {"status": "finished", "output": None},
    ],
)
def test_a_decoded_state_encodes_back_to_what_was_stored(data: dict[str, Any]) -> None:
    state = State.from_dict(data)
    assert state.to_dict() == {k: v for k, v in data.items() if v is not None} | {
        "status": data.get("status", "running")
    }


def test_states_decoded_from_running_tasks_alone_share_no_tables() -> None:
    one = State.from_dict({"status": "running", "running": {"3": 1}})
    two = State.from_dict({"status": "running", "running": {"4": 1}})
    one.waiting["5"] = [[3, {}]]
    one.fanin["6"] = [1, [None]]
    one.stopped["3"] = 1
    assert two.waiting == {} and two.fanin == {} and two.stopped == {}
    assert two == State(running={"4": 1})
