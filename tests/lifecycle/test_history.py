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


def test_an_answer_in_the_same_millisecond_as_its_start_task_comes_after_it() -> None:
    entries = [
        ("{flow}:lifecycle", "5-0", {"kind": "start-workflow"}),
        ("{flow}:lifecycle", "7-1", {"kind": "end-task", "key": "1", "attempt": 1}),
        ("{flow}:lifecycle", "7-2", {"kind": "end-workflow"}),
        ("{flow}:tasks:default", "7-0", {"kind": "start-task", "key": "2", "attempt": 1}),
        ("{flow}:tasks:default", "7-1", {"kind": "start-task", "key": "1", "attempt": 1}),
    ]
    rows = timeline(entries)
    assert [(row["event"], row.get("key")) for row in rows] == [
        ("start-workflow", None),
        ("start-task", "2"),
        ("start-task", "1"),
        ("end-task", "1"),
        ("end-workflow", None),
    ]
