"""inspect, list and history tell the truth: unknown ids, paused workflows, durations,
guard-skipped steps, list's header and limits, and timelines trimmed out of Redis."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from flowstream.cli import main
from lifecycle.cli import EXIT_ERROR, EXIT_OK
from lifecycle.keys import RECEIPTS_GROUP, Keys

KEYS = Keys()
RUNNING = b'{"status": "running", "running": {}}'
FINISHED = b'{"status": "finished", "output": 1}'


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def store(client: redis.Redis, workflow_id: str, fields: dict[str, bytes], at: int) -> None:
    client.zadd(KEYS.workflows, {workflow_id: at})
    client.hset(KEYS.workflow(workflow_id), mapping={"created": str(at).encode(), **fields})  # type: ignore[arg-type]


@pytest.fixture
def flow_file(tmp_path: Path):
    def write(text: str) -> str:
        path = tmp_path / "test.flow"
        path.write_text(text, encoding="utf-8")
        return str(path)

    return write


@pytest.mark.parametrize("command", ["inspect", "history"])
def test_a_workflow_whose_hash_is_gone_is_one_line_exit_2_naming_the_archive(
    redis_client: redis.Redis, redis_url: str, capsys: Any, command: str
) -> None:
    store(redis_client, "wf-expired", {"s": FINISHED}, at=1)
    redis_client.delete(KEYS.workflow("wf-expired"))  # as retention or delete leaves it
    code, out, err = run(capsys, command, "wf-expired", "--redis-url", redis_url)
    assert (code, out) == (EXIT_ERROR, "")
    assert err.count("\n") == 1
    assert err.startswith("error: no workflow 'wf-expired' in Redis (")
    assert "replay ARCHIVE --workflow wf-expired" in err


def test_list_prints_a_header_newest_first_and_stops_at_the_limit(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    for n in range(1, 8):
        store(redis_client, f"wf-{n}", {"s": FINISHED}, at=n)
    code, out, err = run(capsys, "list", "--limit", "3", "--redis-url", redis_url)
    assert (code, err) == (EXIT_OK, "")
    lines = out.splitlines()
    assert lines[0].split("\t") == ["ID", "FLOW", "STATE", "CREATED", "ENDED"]
    assert [line.split("\t")[0] for line in lines[1:]] == ["wf-7", "wf-6", "wf-5"]
    code, out, _ = run(capsys, "list", "--limit", "0", "--json", "--redis-url", redis_url)
    assert len(orjson.loads(out)) == 7


def test_list_fills_its_limit_past_many_ids_that_do_not_match(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    store(redis_client, "wf-old-running", {"s": RUNNING}, at=1)
    for n in range(2, 1200):  # more than one page of finished ones, newer
        store(redis_client, f"wf-{n}", {"s": FINISHED}, at=n)
    code, out, _ = run(capsys, "list", "--state", "running", "--json", "--redis-url", redis_url)
    assert code == EXIT_OK
    assert [r["id"] for r in orjson.loads(out)] == ["wf-old-running"]


def test_list_rejects_an_unknown_state_with_the_valid_ones(redis_url: str, capsys: Any) -> None:
    code, out, err = run(capsys, "list", "--state", "done", "--redis-url", redis_url)
    assert (code, out) == (EXIT_ERROR, "")
    assert err == (
        "error: unknown state 'done' (expected one of running, paused, queued, finished, failed, "
        "terminated, corrupt)\n"
    )


def test_a_paused_workflow_is_shown_paused_with_what_it_holds(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    store(
        redis_client,
        "wf-p",
        {
            "s": b'{"status": "running", "running": {"2": 1}}',
            "p": b'["2"]',
            "n:2": b"[1, 5, 7]",
        },
        at=2,
    )
    store(redis_client, "wf-r", {"s": RUNNING}, at=1)
    code, out, _ = run(capsys, "list", "--state", "paused", "--json", "--redis-url", redis_url)
    assert [(r["id"], r["state"]) for r in orjson.loads(out)] == [("wf-p", "paused")]
    code, out, _ = run(capsys, "list", "--state", "running", "--json", "--redis-url", redis_url)
    assert [r["id"] for r in orjson.loads(out)] == ["wf-r"]
    code, out, _ = run(capsys, "inspect", "wf-p", "--json", "--redis-url", redis_url)
    data = orjson.loads(out)
    assert (data["state"], data["paused"]) == ("paused", ["2"])
    assert [(t["key"], t["state"], t["duration_ms"]) for t in data["tasks"]] == [
        ("2", "held (paused)", None)
    ]
    code, out, _ = run(capsys, "inspect", "wf-p", "--redis-url", redis_url)
    assert "state paused" in out and "held start-tasks 2 (resume" in out


def test_inspect_shows_durations_and_marks_a_step_its_guard_skipped(
    engine: Any, redis_url: str, flow_file: Any, capsys: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the table's cells unwrapped
    flow = flow_file("A → ? `$.go` B → C")
    argv = ["run", flow, "--id", "wf-g", "--input", '{"stay": 1}', "--wait"]
    assert run(capsys, *argv, "--timeout", "30", "--redis-url", redis_url)[0] == EXIT_OK
    code, out, _ = run(capsys, "inspect", "wf-g", "--json", "--redis-url", redis_url)
    tasks = {t["name"]: t for t in orjson.loads(out)["tasks"]}
    assert {name: t["state"] for name, t in tasks.items()} == {
        "A": "ended",
        "B": "skipped (guard)",
        "C": "ended",
    }
    assert isinstance(tasks["A"]["duration_ms"], int) and tasks["A"]["duration_ms"] >= 0
    assert tasks["B"]["duration_ms"] is None
    code, out, _ = run(capsys, "inspect", "wf-g", "--redis-url", redis_url)
    assert "skipped (guard)" in out and " ms" in out


def test_a_running_workflow_has_unstarted_guarded_steps_not_started(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    # A running workflow's record as the engine writes it: A running, B's turn not come.
    from flowlang.compiler import compile_text

    graph = compile_text("A → ? `$.go` B")
    digest = graph.content_hash()
    redis_client.set(KEYS.graph(digest), graph.to_json())
    store(
        redis_client,
        "wf-run",
        {"s": b'{"status": "running", "running": {"1": 1}}', "g": digest.encode()},
        at=1,
    )
    redis_client.hset(KEYS.workflow("wf-run"), "n:1", b"[1, 1000, {}]")
    code, out, _ = run(capsys, "inspect", "wf-run", "--json", "--redis-url", redis_url)
    tasks = {t["name"]: t for t in orjson.loads(out)["tasks"]}
    assert tasks["A"]["state"] == "running" and tasks["A"]["duration_ms"] > 0
    assert tasks["B"]["state"] == "not started"


def _trim_everything(client: redis.Redis) -> None:
    for stream in [KEYS.lifecycle] + [KEYS.tasks(k.decode()) for k in client.smembers(KEYS.kinds)]:
        client.xtrim(stream, maxlen=0, approximate=False)


def test_history_of_a_trimmed_timeline_is_not_complete_and_says_where_the_rest_is(
    engine: Any, redis_client: redis.Redis, redis_url: str, flow_file: Any, capsys: Any
) -> None:
    flow = flow_file("A → B")
    run(capsys, "run", flow, "--id", "wf-t", "--wait", "--timeout", "30", "--redis-url", redis_url)
    code, out, _ = run(capsys, "history", "wf-t", "--json", "--redis-url", redis_url)
    assert orjson.loads(out)["complete"] is True
    _trim_everything(redis_client)
    code, out, _ = run(capsys, "history", "wf-t", "--json", "--redis-url", redis_url)
    data = orjson.loads(out)
    assert (code, data["complete"], data["timeline"]) == (EXIT_OK, False, [])
    assert KEYS.lifecycle in data["lost"]
    assert "not kept anywhere" in data["rest"]  # no receipts group: nothing archived them
    redis_client.xgroup_create(KEYS.lifecycle, RECEIPTS_GROUP, id="$")
    code, out, _ = run(capsys, "history", "wf-t", "--redis-url", redis_url)
    assert "part of this timeline is no longer in Redis" in out
    assert "replay ARCHIVE --workflow wf-t" in out
    code, out, _ = run(capsys, "inspect", "wf-t", "--redis-url", redis_url)
    assert "earlier events are no longer in Redis" in out and "replay ARCHIVE" in out


def test_a_workflow_started_after_the_streams_were_trimmed_has_a_complete_timeline(
    engine: Any, redis_client: redis.Redis, redis_url: str, flow_file: Any, capsys: Any
) -> None:
    flow = flow_file("A → B")
    run(capsys, "run", flow, "--id", "wf-1", "--wait", "--timeout", "30", "--redis-url", redis_url)
    _trim_everything(redis_client)
    run(capsys, "run", flow, "--id", "wf-2", "--wait", "--timeout", "30", "--redis-url", redis_url)
    code, out, _ = run(capsys, "history", "wf-2", "--json", "--redis-url", redis_url)
    data = orjson.loads(out)
    assert (data["complete"], data["lost"]) == (True, [])
    assert [row["event"] for row in data["timeline"]][0] == "start-workflow"
    code, out, _ = run(capsys, "inspect", "wf-2", "--json", "--redis-url", redis_url)
    assert orjson.loads(out)["timeline_lost"] == []
    code, out, _ = run(capsys, "inspect", "wf-1", "--json", "--redis-url", redis_url)
    assert KEYS.lifecycle in orjson.loads(out)["timeline_lost"]


def test_history_of_an_id_deleted_and_started_again_shows_only_the_new_run(
    redis_client: redis.Redis, redis_url: str, harness: Any, capsys: Any
) -> None:
    from flowlang.compiler import compile_text
    from lifecycle.client import Client

    def finish(flow: str) -> None:
        harness.submit(compile_text(flow), workflow_id="wf-again")
        for _ in range(4):
            harness.advance()
            harness.work(lambda call: call.input)

    finish("A → B")
    Client(redis_client, KEYS).delete("wf-again")
    harness.advance()
    assert not redis_client.exists(KEYS.workflow("wf-again"))
    time.sleep(0.002)  # runs of one id a millisecond apart at least, as a person types
    finish("C")
    code, out, _ = run(capsys, "history", "wf-again", "--json", "--redis-url", redis_url)
    data = orjson.loads(out)
    assert (code, data["state"], data["complete"]) == (EXIT_OK, "finished", True)
    assert [(row["event"], row.get("name")) for row in data["timeline"]] == [
        ("start-workflow", None),
        ("start-task", "C"),
        ("end-task", "C"),
        ("end-workflow", None),
    ]


def test_a_task_stream_trimmed_alone_costs_only_the_workflows_that_used_it(
    redis_client: redis.Redis, redis_url: str, harness: Any, capsys: Any
) -> None:
    from flowlang.compiler import compile_text

    for workflow_id, flow in (("wf-ml", "A → ml:B"), ("wf-default", "A → B")):
        harness.submit(compile_text(flow), workflow_id=workflow_id)
        for _ in range(3):
            harness.advance()
            harness.work(lambda call: call.input)
    redis_client.xtrim(KEYS.tasks("ml"), maxlen=0, approximate=False)
    for workflow_id, lost in (("wf-ml", [KEYS.tasks("ml")]), ("wf-default", [])):
        code, out, _ = run(capsys, "inspect", workflow_id, "--json", "--redis-url", redis_url)
        assert (code, orjson.loads(out)["timeline_lost"]) == (EXIT_OK, lost)
        code, out, _ = run(capsys, "history", workflow_id, "--json", "--redis-url", redis_url)
        data = orjson.loads(out)
        assert (data["complete"], data["lost"]) == (not lost, lost)
