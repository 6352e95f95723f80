"""Timelines: one row per workflow event, names filled in from the start-tasks."""

from lifecycle.history import format_timeline, timeline


def test_end_tasks_take_their_name_from_the_start_task_of_their_key() -> None:
    entries = [
        (
            "{flow}:tasks:default",
            "1-0",
            {"kind": "start-task", "key": "1", "attempt": 1, "name": "A"},
        ),
        (
            "{flow}:lifecycle",
            "2-0",
            {"kind": "end-task", "key": "1", "attempt": 1, "status": "SUCCESS"},
        ),
        ("{flow}:lifecycle", "3-0", {"kind": "end-task", "key": "9", "status": "SUCCESS"}),
    ]
    rows = timeline(entries)
    assert [row.get("name") for row in rows] == ["A", "A", None]
    assert "end-task A (1) attempt 1 SUCCESS" in format_timeline(rows)[1]


def test_a_malformed_key_is_shown_as_it_is() -> None:
    entries = [
        ("{flow}:tasks:default", "1-0", {"kind": "start-task", "key": ["1"], "name": "A"}),
        ("{flow}:lifecycle", "2-0", {"kind": "end-task", "key": {"x": 1}, "status": "SUCCESS"}),
    ]
    rows = timeline(entries)
    assert [row["key"] for row in rows] == [["1"], {"x": 1}]
    assert len(format_timeline(rows)) == 2
