"""python -m lifecycle run --id ID for a workflow that exists: refused (exit 2) unless
--if-exists says what to do, and nothing is started a second time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from flowstream.cli import main
from lifecycle.cli import EXIT_ERROR, EXIT_FAILED, EXIT_OK
from lifecycle.keys import Keys
from tests.conftest import wait_until


@pytest.fixture
def flow(tmp_path: Path) -> str:
    path = tmp_path / "one.flow"
    path.write_text("A → B", encoding="utf-8")
    return str(path)


@pytest.fixture
def finished(engine: Any, redis_url: str, flow: str, capsys: Any) -> str:
    """The id of a workflow that ran to its end (output {"n": 1})."""
    code = main(["run", flow, "--id", "wf-1", "--input", '{"n": 1}', "--wait"] + url(redis_url))
    assert code == EXIT_OK
    capsys.readouterr()
    return "wf-1"


def url(redis_url: str) -> list[str]:
    return ["--redis-url", redis_url, "--timeout", "30"]


def test_run_with_the_id_of_an_existing_workflow_is_refused_in_one_line_and_starts_nothing(
    finished: str, redis_client: redis.Redis, redis_url: str, flow: str, capsys: Any
) -> None:
    before = redis_client.xlen(Keys().lifecycle)
    for wait in ([], ["--wait"]):
        code = main(["run", flow, "--id", finished, "--input", '{"n": 2}', *wait] + url(redis_url))
        out, err = capsys.readouterr()
        assert code == EXIT_ERROR
        assert out == ""
        assert (
            err == f"error: workflow {finished} exists (state finished); --if-exists return|fail\n"
        )
    assert redis_client.xlen(Keys().lifecycle) == before


def test_if_exists_fail_exits_1_for_an_existing_workflow(
    finished: str, redis_client: redis.Redis, redis_url: str, flow: str, capsys: Any
) -> None:
    before = redis_client.xlen(Keys().lifecycle)
    code = main(["run", flow, "--id", finished, "--if-exists", "fail"] + url(redis_url))
    assert code == EXIT_FAILED
    assert capsys.readouterr().err == f"error: workflow {finished} exists (state finished)\n"
    assert redis_client.xlen(Keys().lifecycle) == before


def test_if_exists_return_gives_the_existing_workflows_id_and_result(
    finished: str, redis_client: redis.Redis, redis_url: str, flow: str, capsys: Any
) -> None:
    before = redis_client.xlen(Keys().lifecycle)
    returned = ["--id", finished, "--input", '{"n": 2}', "--if-exists", "return"]
    assert main(["run", flow, *returned] + url(redis_url)) == EXIT_OK
    assert capsys.readouterr().out == f"{finished}\n"
    assert main(["run", flow, *returned, "--wait"] + url(redis_url)) == EXIT_OK
    out = capsys.readouterr().out
    first, _, rest = out.partition("\n")
    assert first == finished
    assert orjson.loads(rest) == {"n": 1}  # the first run's output, not a new run's
    assert redis_client.xlen(Keys().lifecycle) == before


def test_if_exists_starts_a_workflow_whose_id_is_new(
    engine: Any, redis_url: str, flow: str, capsys: Any
) -> None:
    for choice in ("fail", "return"):
        args = ["run", flow, "--id", f"new-{choice}", "--if-exists", choice, "--wait"]
        assert main(args + url(redis_url)) == EXIT_OK
        assert capsys.readouterr().out.startswith(f"new-{choice}\n")


def test_an_unknown_if_exists_choice_is_a_usage_error(flow: str, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", flow, "--id", "x", "--if-exists", "replace"])
    assert exited.value.code == EXIT_ERROR
    assert "invalid choice: 'replace'" in capsys.readouterr().err


def test_the_refusal_names_a_paused_workflow_as_paused(
    engine: Any, redis_client: redis.Redis, redis_url: str, tmp_path: Path, capsys: Any
) -> None:
    from flowlang.compiler import compile_text
    from lifecycle.client import Client

    client = Client(redis_client)
    held = client.submit(compile_text("nobody:serves → B"), workflow_id="wf-held")
    wait_until(lambda: client.exists(held), what="the workflow's record")
    assert client.pause(held, wait=10).state == "paused"
    flow = tmp_path / "held.flow"
    flow.write_text("nobody:serves → B", encoding="utf-8")
    assert main(["run", str(flow), "--id", held] + url(redis_url)) == EXIT_ERROR
    assert capsys.readouterr().err == (
        f"error: workflow {held} exists (state paused); --if-exists return|fail\n"
    )


def test_two_runs_of_one_id_before_the_lifecycle_applies_either_start_it_once(
    redis_client, tmp_path
) -> None:
    from flowlang.compiler import compile_text
    from lifecycle.keys import Keys
    from lifecycle.submit import start_workflow_once

    keys = Keys()
    first = start_workflow_once(redis_client, compile_text("A"), {"n": 1}, "same", keys)
    second = start_workflow_once(redis_client, compile_text("B"), {"n": 2}, "same", keys)
    assert (first, second) == (True, False)
    starts = [
        f for _, f in redis_client.xrange(keys.lifecycle) if f[b"kind"] == b'"start-workflow"'
    ]
    assert len(starts) == 1 and starts[0][b"input"] == b'{"n":1}'


def test_a_second_run_of_an_id_whose_start_is_not_applied_yet_is_refused(
    redis_url, redis_client, tmp_path, capsys
) -> None:
    from lifecycle.cli import main

    flow = tmp_path / "a.flow"
    flow.write_text("A", encoding="utf-8")
    url = ["--redis-url", redis_url]
    assert main(["run", str(flow), "--id", "twice", *url]) == 0  # no lifecycle worker runs
    capsys.readouterr()
    assert main(["run", str(flow), "--id", "twice", *url]) == 2
    assert "exists (state starting" in capsys.readouterr().err
    assert main(["run", str(flow), "--id", "", *url]) == 2
