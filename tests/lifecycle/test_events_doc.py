"""docs/events.md documents every workflow event kind and every field lifecycle.events
builds: a field added in code and not in the docs fails here."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from lifecycle import events as ev

DOC = (Path(__file__).parents[2] / "docs" / "events.md").read_text()


def _rows() -> dict[str, str]:
    """The table rows of the 'Workflow events' section, by the kind in their first cell."""
    section = DOC[DOC.index("## Workflow events") :]
    rows = {}
    for line in section.splitlines():
        found = re.match(r"\| `([a-z-]+)` \|(.*)", line)
        if found:
            rows[found.group(1)] = found.group(2)
    return rows


def _start_task_fields() -> set[str]:
    template = ev.start_task_template("s", "A", 1, {}, "source", priority=1)
    words = [w for w in template.arguments if isinstance(w, bytes)]
    return {w.decode() for w in words if re.fullmatch(rb"[a-z]+", w)} | {ev.RECOVERED}


BUILT = {
    ev.START_WORKFLOW: set(ev.start_workflow("w", "g", {}, priority=1))
    | set(ev.start_workflow("w", "g", {}, concurrency_key="k", max_running=1))
    | set(ev.start_workflow("w", "g", {}, claimed=True)),
    ev.ADMIT_WORKFLOW: {"kind", "workflow"},  # written by gate.lua only
    ev.END_TASK: set(ev.end_task({"workflow": "w", "key": "1", "attempt": 1, "token": "t"}, {}))
    | set(ev.end_task({"workflow": "w", "key": "1"}, error="e", worker="x")),
    ev.END_TASKS: {
        name.decode() for name in ev.end_tasks_fields("w", [b'["w","1",1,"t",{}]'])[::2]
    },
    ev.START_TASKS: {name.decode() for name in ev.start_tasks_fields([b'{"workflow":"w"}'])[::2]},
    **{kind: set(ev.control(kind, "w", "why")) for kind in ev.CONTROLS},
    ev.END_WORKFLOW: set(ev.end_workflow("w", {})),
    ev.FAILED_WORKFLOW: set(ev.failed_workflow("w", "r", "terminated")),
    ev.RETRY_TASK: set(orjson.loads(ev.timer_member(ev.RETRY_TASK, "w", "1", 1))),
    ev.TIMEOUT_TASK: set(orjson.loads(ev.timer_member(ev.TIMEOUT_TASK, "w", "1", 1))),
}


def test_every_event_kind_has_a_row_in_the_docs() -> None:
    assert set(ev.KINDS) <= set(_rows())


def test_every_field_the_builders_write_is_documented_in_its_kinds_row() -> None:
    rows = _rows()
    built = {**BUILT, ev.START_TASK: _start_task_fields()}
    assert set(built) == set(ev.KINDS)
    for kind, fields in built.items():
        missing = {f for f in fields - {"kind"} if f"`{f}`" not in rows[kind]}
        assert not missing, f"docs/events.md row {kind}: fields {sorted(missing)} undocumented"


def test_a_start_tasks_pack_holds_the_fields_of_the_start_tasks_it_stands_for() -> None:
    template = ev.start_task_template("s", "A", 1, {"p": "50%"}, "source", priority=1)
    values = (b'"w"', b'"1"', b"2", b'"w/1/2"', b'"t"', b'{"in": 1}')
    fields = ev.start_tasks_fields([ev.start_task_piece(template) % values])
    pack = {"kind": ev.START_TASKS, "tasks": orjson.loads(fields[3])}
    (start,) = ev.unpacked_starts("1-0", pack)
    single = template.unpacked(*values)[3:]
    assert start == {
        k.decode(): orjson.loads(v) for k, v in zip(single[::2], single[1::2], strict=True)
    }
