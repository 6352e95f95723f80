"""inspect, list and history never crash on a stored record: what cannot be read is shown
as corrupt (with its raw value) and the rest, and every other workflow, is shown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from flowstream.cli import main
from lifecycle.cli import EXIT_ERROR, EXIT_OK
from lifecycle.keys import Keys

KEYS = Keys()
GOOD_STATE = b'{"status": "finished", "output": {"ok": true}}'


def store(client: redis.Redis, workflow_id: str, fields: dict[str, bytes], at: int = 1) -> None:
    client.zadd(KEYS.workflows, {workflow_id: at})
    client.hset(KEYS.workflow(workflow_id), mapping=fields)  # type: ignore[arg-type]


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


CORRUPT_STATES = {
    "not JSON": (b"{oops", "field s: not JSON"),
    "too deep": (b"[" * 300 + b"]" * 300, "field s: nests deeper than 256 levels"),
    "wrong type": (b"[1, 2]", "field s: is list, expected an object"),
    "bad status": (b'{"status": 7}', "field s: status 7 is none of"),
    "not UTF-8": (b"\xff\xfe{", "field s: not JSON"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT_STATES))
def test_inspect_shows_a_corrupt_state_field_and_goes_on(
    redis_client: redis.Redis, redis_url: str, capsys: Any, case: str
) -> None:
    raw, expected = CORRUPT_STATES[case]
    store(redis_client, "wf-bad", {"s": raw, "name": b"shown", "created": b"1700000000000"})
    code, out, err = run(capsys, "inspect", "wf-bad", "--json", "--redis-url", redis_url)
    assert (code, err) == (EXIT_OK, "")
    data = orjson.loads(out)
    assert (data["state"], data["flow"]) == ("corrupt", "shown")
    assert data["created"] == "2023-11-14T22:13:20.000+00:00"
    [problem] = data["corrupt"]
    assert problem.startswith(f"corrupt record: {expected}")
    code, out, err = run(capsys, "inspect", "wf-bad", "--redis-url", redis_url)
    assert (code, err) == (EXIT_OK, "")
    assert "corrupt record: field s:" in out


def test_a_value_not_utf8_is_shown_in_base64(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    store(redis_client, "wf-bin", {"s": GOOD_STATE, "input": b"\xff\x00\x01"})
    code, out, _ = run(capsys, "inspect", "wf-bin", "--json", "--redis-url", redis_url)
    assert code == EXIT_OK
    [problem] = orjson.loads(out)["corrupt"]
    assert problem.startswith("corrupt record: field input: not JSON: ")
    assert problem.endswith(" (raw: base64:/wAB)")


def test_task_records_of_the_wrong_shape_are_corrupt_and_the_others_shown(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    store(
        redis_client,
        "wf-tasks",
        {
            "s": GOOD_STATE,
            "n:0": b"[1, 1700000000000, null]",
            "o:0": b'[1700000000001, true, {"x": 1}, null, "w1"]',
            "n:1": b'"not a list"',
            "o:1": b'["late", true, null, null, null]',
            "n:x": b"[1, 2, 3]",
        },
    )
    code, out, err = run(capsys, "inspect", "wf-tasks", "--json", "--redis-url", redis_url)
    assert (code, err) == (EXIT_OK, "")
    data = orjson.loads(out)
    assert data["state"] == "finished" and data["output"] == {"ok": True}
    assert [(t["key"], t["state"], t["worker"]) for t in data["tasks"]] == [("0", "ended", "w1")]
    assert sorted(data["corrupt"]) == [
        'corrupt record: field n:1: expected [attempt, started ms, input] (raw: "not a list")',
        "corrupt record: field n:x: not a task instance key",
        "corrupt record: field o:1: ended is str, expected int or null"
        ' (raw: ["late", true, null, null, null])',
    ]


def test_a_missing_state_and_a_missing_graph_are_shown(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    store(redis_client, "wf-nos", {"g": b"0" * 64, "n:0": b"[1, 1, null]", "created": b"nope"})
    code, out, err = run(capsys, "inspect", "wf-nos", "--json", "--redis-url", redis_url)
    assert (code, err) == (EXIT_OK, "")
    data = orjson.loads(out)
    assert data["tasks"][0]["kind"] == "?"
    assert sorted(data["corrupt"]) == [
        "corrupt record: field created: not an integer (raw: nope)",
        f"corrupt record: field g: graph {'0' * 64}: compiled flow {'0' * 64} "
        "is not stored in Redis",
        "corrupt record: field s: missing",
    ]


def test_a_value_deeper_than_orjson_writes_is_still_printed(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    deep = b"[" * 255 + b"]" * 255  # the state within the limit (256), past orjson's 254
    store(redis_client, "wf-deep", {"s": b'{"status": "finished", "output": ' + deep + b"}"})
    code, out, err = run(capsys, "inspect", "wf-deep", "--json", "--redis-url", redis_url)
    assert (code, err) == (EXIT_OK, "")
    assert orjson.loads(out)["output"] == orjson.loads(deep)
    code, out, err = run(capsys, "inspect", "wf-deep", "--redis-url", redis_url)
    assert (code, err) == (EXIT_OK, "")


def test_list_shows_every_workflow_even_beside_corrupt_ones_newest_first(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    store(redis_client, "wf-1", {"s": GOOD_STATE, "created": b"1"}, at=1)
    store(redis_client, "wf-2", {"s": b"{oops", "created": b"2"}, at=2)
    store(redis_client, "wf-3", {"s": b'{"status": "running"}', "name": b"\xff"}, at=3)
    redis_client.zadd(KEYS.workflows, {"wf-gone": 4})
    code, out, err = run(capsys, "list", "--json", "--redis-url", redis_url)
    assert (code, err) == (EXIT_OK, "")
    rows = orjson.loads(out)
    # wf-gone's hash is gone (retention, delete): no such workflow, not listed
    assert [(r["id"], r["state"]) for r in rows] == [
        ("wf-3", "running"),
        ("wf-2", "corrupt"),
        ("wf-1", "finished"),
    ]
    assert rows[1]["corrupt"][0].startswith("corrupt record: field s: not JSON")
    assert rows[0]["corrupt"] == ["corrupt record: field name: not UTF-8 text (raw: base64:/w==)"]
    assert "corrupt" not in rows[2]
    code, out, err = run(capsys, "list", "--redis-url", redis_url)
    assert (code, err) == (EXIT_OK, "")
    lines = out.splitlines()
    assert len(lines) == 4 and "corrupt record: field s: not JSON" in lines[2]
    code, out, _ = run(capsys, "list", "--state", "corrupt", "--redis-url", redis_url)
    assert [line.split("\t")[0] for line in out.splitlines()] == ["ID", "wf-2"]


def test_history_shows_a_corrupt_record_and_a_corrupt_entry(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    store(redis_client, "wf-h", {"s": b"{oops", "created": b"1"})
    redis_client.xadd(KEYS.lifecycle, {"kind": b'"end-task"', "workflow": b'"wf-h"', "key": b"{"})
    code, out, err = run(capsys, "history", "wf-h", "--redis-url", redis_url)
    assert (code, err) == (EXIT_OK, "")
    assert "workflow wf-h: corrupt" in out
    assert "corrupt record: field s: not JSON" in out
    assert f"corrupt entry {KEYS.lifecycle} " in out and "field key: not JSON" in out
    assert "end-task" in out
    code, out, err = run(capsys, "history", "wf-h", "--json", "--redis-url", redis_url)
    assert (code, err) == (EXIT_OK, "")
    assert len(orjson.loads(out)["corrupt"]) == 2


def test_history_of_an_unknown_workflow_is_one_line(redis_url: str, capsys: Any) -> None:
    code, out, err = run(capsys, "history", "nope", "--redis-url", redis_url)
    assert (code, out) == (EXIT_ERROR, "")
    assert err.startswith("error: no workflow 'nope' in Redis (") and err.count("\n") == 1


def test_a_failed_workflow_shows_its_reason_in_inspect_and_history(
    engine: Any, redis_url: str, tmp_path: Path, capsys: Any
) -> None:
    flow = tmp_path / "fails.flow"
    flow.write_text("A → * B", encoding="utf-8")
    argv = ["run", str(flow), "--id", "wf-f", "--input", '{"x": 1}', "--wait"]
    code, _, err = run(capsys, *argv, "--timeout", "30", "--redis-url", redis_url)
    assert code == 1 and "cannot iterate over an object" in err
    code, out, _ = run(capsys, "inspect", "wf-f", "--redis-url", redis_url)
    assert code == EXIT_OK and "state failed" in out and "cannot iterate over an object" in out
    code, out, _ = run(capsys, "history", "wf-f", "--redis-url", redis_url)
    assert code == EXIT_OK and "workflow wf-f: failed" in out
    assert "error: " in out and "cannot iterate over an object" in out
