"""python -m lifecycle demo: the built-in flow runs end to end on an embedded server, a
bad input is refused in one line before any server starts, and Ctrl-C or SIGTERM stops
the workers and then the server, in one line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from flowstream.cli import main
from lifecycle.cli import EXIT_ERROR, EXIT_FAILED, EXIT_OK


@pytest.fixture
def no_redis_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("REDIS_URL", "REDIS_HOST", "REDIS_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "flowstream"


def test_the_built_in_demo_flow_finishes(no_redis_configured: Path, capsys: Any) -> None:
    assert main(["demo", "--delay-max", "0"]) == EXIT_OK
    output = orjson.loads(capsys.readouterr().out)  # stdout holds the output alone
    # notify | archive each pass the summary on: the three orders, the big one reviewed.
    assert [[item["done"] for item in branch] for branch in output] == [
        [["price"], ["price", "review"], ["price"]]
    ] * 2
    assert (no_redis_configured / "redis").is_dir()


def test_a_bad_demo_input_is_one_line_before_any_server_starts(
    no_redis_configured: Path, capsys: Any
) -> None:
    assert main(["demo", "--input", "{oops"]) == EXIT_ERROR
    assert capsys.readouterr().err.startswith("error: --input: invalid JSON")
    assert not no_redis_configured.exists()


def _interrupted_demo(tmp_path: Path, send: Any) -> tuple[int, str]:
    """Run the demo with slow tasks, call ``send(proc)`` once it started the workflow;
    its exit code and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lifecycle", "demo", "--delay-max", "20"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a process group of its own, as a terminal gives
    )
    assert proc.stderr is not None
    lines = []
    for raw in proc.stderr:
        lines.append(raw.decode())
        if raw.startswith(b"started "):
            break
    send(proc)
    rest = proc.stderr.read().decode()
    code = proc.wait(timeout=30)
    return code, "".join(lines) + rest


def _server_is_gone(err: str) -> bool:
    port = int(re.search(r"on redis://127\.0\.0\.1:(\d+)", err)[1])  # type: ignore[index]
    try:
        redis.Redis(port=port, socket_connect_timeout=1).ping()
    except redis.ConnectionError:
        return True
    return False


@pytest.mark.parametrize(
    "send",
    [
        pytest.param(lambda p: os.killpg(p.pid, signal.SIGINT), id="ctrl-c-to-the-group"),
        pytest.param(lambda p: p.send_signal(signal.SIGTERM), id="sigterm-to-the-demo"),
    ],
)
def test_an_interrupted_demo_stops_its_workers_and_server_in_one_line(
    tmp_path: Path, send: Any
) -> None:
    code, err = _interrupted_demo(tmp_path, send)
    assert code == EXIT_FAILED
    assert err.rstrip().splitlines()[-1] == "demo interrupted: workers and server stopped"
    assert "Traceback" not in err and "unreachable" not in err
    assert _server_is_gone(err)


def test_the_demo_names_the_redis_it_was_given(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    assert main(["demo", "--delay-max", "0", "--redis-url", redis_url]) == EXIT_OK
    err = capsys.readouterr().err
    assert err.splitlines()[0] == f"Redis at {redis_url} (--redis-url)"
    assert "embedded server" not in err
