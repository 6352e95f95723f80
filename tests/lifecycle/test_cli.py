"""python -m lifecycle: run, inspect, list, and one clean line for every error."""

from pathlib import Path

import orjson
import pytest

from flowstream.cli import main
from lifecycle.cli import EXIT_ERROR, EXIT_FAILED, EXIT_OK


@pytest.fixture
def flow_file(tmp_path: Path):
    def write(text: str) -> str:
        path = tmp_path / "test.flow"
        path.write_text(text, encoding="utf-8")
        return str(path)

    return write


def test_run_wait_prints_the_workflow_output(engine, redis_url, flow_file, capsys) -> None:
    code = main(
        ["run", flow_file("A → ml:B"), "--input", '{"x": 1}', "--wait", "--redis-url", redis_url]
    )
    out = capsys.readouterr().out.splitlines()
    assert code == EXIT_OK
    assert orjson.loads("".join(out[1:])) == {"x": 1}


def test_run_wait_exits_1_when_the_workflow_fails(engine, redis_url, flow_file, capsys) -> None:
    code = main(
        [
            "run",
            flow_file("A → * B"),
            "--input",
            '{"not": "a list"}',
            "--wait",
            "--redis-url",
            redis_url,
        ]
    )
    assert code == EXIT_FAILED
    assert "cannot iterate over an object" in capsys.readouterr().err


def test_inspect_and_list_show_a_finished_workflow(engine, redis_url, flow_file, capsys) -> None:
    main(
        ["run", flow_file("@flow shown\nA → B"), "--id", "wf-1", "--wait", "--redis-url", redis_url]
    )
    capsys.readouterr()
    assert main(["inspect", "wf-1", "--json", "--redis-url", redis_url]) == EXIT_OK
    data = orjson.loads(capsys.readouterr().out)
    assert (data["state"], data["flow"]) == ("finished", "shown")
    assert [(t["name"], t["state"], t["attempts"]) for t in data["tasks"]] == [
        ("A", "ended", 1),
        ("B", "ended", 1),
    ]
    assert main(["list", "--json", "--state", "finished", "--redis-url", redis_url]) == EXIT_OK
    rows = orjson.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == ["wf-1"]
    assert main(["list", "--state", "running", "--redis-url", redis_url]) == EXIT_OK
    assert capsys.readouterr().out == "ID\tFLOW\tSTATE\tCREATED\tENDED\n"
    assert main(["inspect", "wf-1", "--redis-url", redis_url]) == EXIT_OK
    assert "finished" in capsys.readouterr().out


def test_a_bad_flow_is_one_line_with_its_position(redis_url, flow_file, capsys) -> None:
    path = flow_file("A → → B")
    assert main(["run", path, "--redis-url", redis_url]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err == f"error: {path}:1:5: stray arrow: expected a step before it\n"


def test_an_unknown_workflow_is_one_line(redis_url, capsys) -> None:
    assert main(["inspect", "nope", "--redis-url", redis_url]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: no workflow 'nope' in Redis (") and err.count("\n") == 1


def test_unreachable_redis_is_one_line_without_the_password(capsys) -> None:
    assert main(["list", "--redis-url", "redis://user:secret@127.0.0.1:1/0"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach Redis at") and err.count("\n") == 1
    assert "secret" not in err


def test_bad_input_json_is_one_line(redis_url, flow_file, capsys) -> None:
    assert main(["run", flow_file("A"), "--input", "{oops", "--redis-url", redis_url]) == EXIT_ERROR
    assert capsys.readouterr().err.startswith("error: --input: invalid JSON")


def test_bad_retry_policy_is_refused_before_anything_runs(redis_url, flow_file, capsys) -> None:
    assert main(["run", flow_file("A (- $retries: -1 -)"), "--redis-url", redis_url]) == EXIT_ERROR
    assert "$retries must be a non-negative number" in capsys.readouterr().err


def test_demo_runs_a_flow_with_resources_and_waits_on_an_embedded_server(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    for name in ("REDIS_URL", "REDIS_HOST", "REDIS_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "items.json").write_text('[{"id": 1}, {"id": 2}]')
    flow = tmp_path / "demo.flow"
    flow.write_text("<items.json> → * { A → wait:delay (- duration: 0.2 -) } → B → <out.json>")
    assert main(["demo", str(flow), "--delay-max", "0"]) == EXIT_OK
    printed = capsys.readouterr().out
    output = orjson.loads(printed[printed.index("[") :])
    assert [item["id"] for item in output] == [1, 2]
    assert orjson.loads((tmp_path / "out.json").read_bytes()) == output
    assert (tmp_path / "state" / "flowstream" / "redis").is_dir()
