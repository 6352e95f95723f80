"""What the control commands say: their help, one line per id, a filter's summary, and
what happened when the workflow moved on before or right after the action.

The lifecycle is the in-process harness, advanced by the test while a command waits
in a thread, so each race is set up in a known order.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall
from lifecycle.cli import main
from lifecycle.client import Client
from lifecycle.errors import unknown_workflow
from lifecycle.keys import Keys
from tests.conftest import wait_until
from tests.lifecycle.harness import Harness

KEYS = Keys()


def ok(call: TaskCall) -> Any:
    return {"done": call.name}


def broken(call: TaskCall) -> Any:
    raise RuntimeError(f"{call.name} broke")


@pytest.fixture
def url_args(redis_url: str) -> list[str]:
    return ["--redis-url", redis_url]


def state(harness: Harness, workflow_id: str) -> str:
    return Client(harness.client, KEYS).status(workflow_id).state


def while_the_lifecycle_runs(harness: Harness, argv: list[str], task: Any = ok) -> int:
    """Run the command in a thread and, once its events are on the stream, pump the
    harness until the command returns; its exit code."""
    length = harness.client.xlen(KEYS.lifecycle)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(main(argv)))
    thread.start()
    wait_until(lambda: harness.client.xlen(KEYS.lifecycle) > length or not thread.is_alive())
    while thread.is_alive():
        harness.pump(task)
        thread.join(0.02)
    return codes[0]


def test_each_controls_help_names_its_states_output_and_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    states = {
        "terminate": "running and paused",
        "pause": "running workflows",
        "resume": "paused workflows",
        "restart": "failed and terminated",
        "delete": "finished, failed and terminated",
    }
    for command, applies in states.items():
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert f"Applies to {applies}" in text, command
        assert "combine as AND" in text and "at least one id or filter" in text
        assert "exit codes: 0 done or already so" in text and "2 an unknown id" in text
        assert "for all of them together" in text  # --timeout with several ids
    with pytest.raises(SystemExit):
        main(["terminate", "--help"])
    assert "(default 'terminated')" in " ".join(capsys.readouterr().out.split())


def test_state_accepts_only_the_states_the_action_applies_to(
    url_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for command, state in (("pause", "finished"), ("resume", "running"), ("delete", "running")):
        with pytest.raises(SystemExit) as exit:
            main([command, "--state", state, *url_args])
        assert exit.value.code == 2
        assert "invalid choice" in capsys.readouterr().err


def test_several_ids_get_a_line_each_and_an_unknown_one_exits_2_after_the_others(
    harness: Harness, url_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for workflow_id in ("done-1", "gone-1"):
        harness.submit(compile_text("A → B"), workflow_id=workflow_id)
    harness.advance()
    Client(harness.client, KEYS).terminate("gone-1")
    harness.pump(ok)
    assert state(harness, "done-1") == "finished"
    harness.submit(compile_text("A → B"), workflow_id="run-2")
    harness.advance()
    argv = ["terminate", "run-2", "gone-1", "nope", "done-1", "run-2", *url_args]
    assert while_the_lifecycle_runs(harness, argv) == 2
    out, err = capsys.readouterr()
    assert out.splitlines() == ["workflow run-2: terminated", "workflow gone-1: already terminated"]
    assert err.splitlines() == [
        f"error: {unknown_workflow('nope')}",
        "workflow done-1: not allowed: the workflow has finished; only a running or paused "
        "one can be terminated",
    ]
    assert state(harness, "run-2") == "terminated"


def test_an_id_the_state_filter_does_not_match_is_skipped_and_said_so(
    harness: Harness, url_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    harness.submit(compile_text("A → B"), workflow_id="wf")
    harness.advance()
    assert main(["terminate", "wf", "--state", "paused", "--no-wait", *url_args]) == 0
    assert capsys.readouterr().out == "workflow wf: not in state paused (it is running), skipped\n"
    assert harness.client.xlen(KEYS.lifecycle) == 1  # only its start-workflow
    assert main(["terminate", "wf", "--flow", "other", "--no-wait", *url_args]) == 0
    assert "not of flow other" in capsys.readouterr().out


def test_a_filter_summary_counts_what_matched_but_was_skipped_and_why(
    harness: Harness, url_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    client = Client(harness.client, KEYS)
    graph = compile_text("@flow nightly\nA → B")
    harness.submit(graph, workflow_id="f-0")
    harness.pump(ok)
    for n in range(2):
        harness.submit(graph, workflow_id=f"t-{n}")
    harness.advance()
    for n in range(2):
        client.terminate(f"t-{n}")
    harness.advance()
    finished = "the workflow has finished; only a running or paused one can be terminated"
    assert main(["terminate", "--flow", "nightly", *url_args]) == 0
    assert capsys.readouterr() == (
        "terminate: 0 sent; 2 matched but already terminated; 1 matched but not allowed\n",
        f"  1 not allowed: {finished} (f-0)\n",
    )

    assert main(["pause", "--flow", "nobody", *url_args]) == 0
    assert capsys.readouterr().out == "pause: 0 sent; no workflow matched --flow nobody\n"

    assert main(["restart", "--state", "terminated", "--flow", "nightly", *url_args]) == 0
    assert capsys.readouterr() == ("restart: 2 sent\n", "")
    harness.advance()
    assert main(["delete", "--flow", "nightly", *url_args]) == 0
    assert capsys.readouterr() == (
        "delete: 1 sent; 2 matched but not allowed\n",
        "  2 not allowed: the workflow is running; terminate it before deleting it (t-0, t-1)\n",
    )


def test_state_given_twice_selects_running_and_paused_workflows(
    harness: Harness, url_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    graph = compile_text("@flow batch\nA → B")
    for workflow_id in ("running-1", "paused-1"):
        harness.submit(graph, workflow_id=workflow_id)
    harness.advance()
    Client(harness.client, KEYS).pause("paused-1")
    harness.advance()
    argv = ["terminate", "--state", "running", "--state", "paused", "--flow", "batch"]
    assert main([*argv, *url_args]) == 0
    assert capsys.readouterr().out == "terminate: 2 sent\n"
    harness.advance()
    assert {state(harness, w) for w in ("running-1", "paused-1")} == {"terminated"}


def test_a_restart_whose_task_fails_again_at_once_says_it_restarted(
    harness: Harness, url_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    harness.submit(compile_text("A"), workflow_id="wf")
    harness.pump(broken)
    assert state(harness, "wf") == "failed"
    assert while_the_lifecycle_runs(harness, ["restart", "wf", *url_args], broken) == 0
    assert capsys.readouterr().out == (
        "workflow wf: restarted (now failed again: task A (1) failed: A broke)\n"
    )


def test_a_resume_that_arrives_after_the_workflow_finished_says_it_was_not_applied(
    harness: Harness, url_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    harness.submit(compile_text("A"), workflow_id="wf")
    harness.advance()
    Client(harness.client, KEYS).pause("wf")
    harness.advance()
    harness.work(ok)  # A's end is on the stream, ahead of the resume: it finishes first
    assert while_the_lifecycle_runs(harness, ["resume", "wf", *url_args]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == "workflow wf: finished before the resume reached it (not resumed)\n"


def test_unknown_ids_read_the_same_in_inspect_and_in_the_controls(
    redis_client: redis.Redis, url_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    lines = set()
    for command in ("inspect", "history", "pause", "delete"):
        assert main([command, "nope", *url_args]) == 2
        lines.add(capsys.readouterr().err)
    assert lines == {f"error: {unknown_workflow('nope')}\n"}


def test_a_terminate_that_arrives_after_the_workflow_finished_exits_1_and_says_so(
    harness: Harness, url_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    harness.submit(compile_text("A"), workflow_id="wf")
    harness.advance()
    harness.work(ok)  # A's end is on the stream, ahead of the terminate
    assert while_the_lifecycle_runs(harness, ["terminate", "wf", *url_args]) == 1
    assert capsys.readouterr().err == (
        "workflow wf: finished before the terminate reached it (not terminated)\n"
    )


def test_no_wait_with_several_ids_says_each_was_sent(
    harness: Harness, url_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for workflow_id in ("a", "b"):
        harness.submit(compile_text("A → B"), workflow_id=workflow_id)
    harness.advance()
    assert main(["pause", "a", "b", "--no-wait", *url_args]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" (event ")[0] for line in lines] == [
        "workflow a: pause sent",
        "workflow b: pause sent",
    ]
    harness.advance()
    assert {state(harness, w) for w in ("a", "b")} == {"paused"}
