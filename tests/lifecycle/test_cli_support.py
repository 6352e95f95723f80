"""The lifecycle CLI's one error mapping: every error family is one line on stderr with
its exit code, never a traceback; and `python -m lifecycle` is the composed program."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from flowstream.cli import main
from lifecycle.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, build_parser
from lifecycle.cli.support import dispatch
from lifecycle.keys import Keys
from tests.processes import Processes


@pytest.fixture
def flow(tmp_path: Path) -> str:
    path = tmp_path / "one.flow"
    path.write_text("A", encoding="utf-8")
    return str(path)


def run(capsys: Any, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_exit_usage_is_the_historical_exit_error() -> None:
    assert EXIT_USAGE == EXIT_ERROR == 2


def test_every_command_dispatches_through_its_func() -> None:
    def leaves(parser: argparse.ArgumentParser, name: str) -> Any:
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not nested:
            yield name, parser
        for action in nested:  # a command with its own subcommands (dead-letters list)
            for sub_name, sub in action.choices.items():
                yield from leaves(sub, f"{name} {sub_name}".strip())

    for parser in (build_parser(), build_parser(_composed())):
        for name, command in leaves(parser, ""):
            assert callable(command.get_default("func")), name


def _composed() -> Any:
    from flowstream.cli import COMMANDS

    return COMMANDS


def test_the_engine_program_has_no_demo_and_its_worker_serves_no_wait() -> None:
    engine = build_parser()
    with pytest.raises(SystemExit):
        engine.parse_args(["demo"])
    with pytest.raises(SystemExit):
        engine.parse_args(["worker", "--no-wait"])
    assert build_parser(_composed()).parse_args(["worker", "--no-wait"]).no_wait


def test_redis_out_of_memory_is_one_line(
    redis_client: redis.Redis, redis_url: str, flow: str, capsys: Any
) -> None:
    redis_client.set("ballast", "x" * 1000)
    redis_client.config_set("maxmemory", 1)
    try:
        code, err = run(capsys, "run", flow, "--redis-url", redis_url)
    finally:
        redis_client.config_set("maxmemory", 0)
    assert code == EXIT_ERROR
    assert err.startswith(f"error: Redis at {redis_url} (--redis-url) is out of memory")
    assert err.count("\n") == 1


def test_a_read_only_redis_is_one_line(
    redis_client: redis.Redis, redis_url: str, flow: str, capsys: Any
) -> None:
    # A replica of a master that does not answer refuses writes with READONLY.
    redis_client.execute_command("REPLICAOF", "127.0.0.1", "1")
    try:
        code, err = run(capsys, "run", flow, "--redis-url", redis_url)
    finally:
        redis_client.execute_command("REPLICAOF", "NO", "ONE")
    assert code == EXIT_ERROR
    assert err.startswith(f"error: Redis at {redis_url} (--redis-url) is read-only")
    assert err.count("\n") == 1


def test_wrong_credentials_are_one_line_without_the_password(redis_url: str, capsys: Any) -> None:
    url = redis_url.replace("redis://", "redis://nobody:hunter2@")
    code, err = run(capsys, "list", "--redis-url", url)
    assert code == EXIT_ERROR
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "hunter2" not in err and "nobody:***@" in err


def test_an_unsupported_url_scheme_is_one_line(capsys: Any) -> None:
    code, err = run(capsys, "list", "--redis-url", "http://localhost:6379")
    assert (code, err) == (
        EXIT_ERROR,
        "error: unsupported Redis URL scheme 'http' from --redis-url "
        "(expected redis://, rediss:// or unix://)\n",
    )


def test_an_unexpected_error_is_one_line_not_a_traceback(capsys: Any) -> None:
    def broken(args: argparse.Namespace, context: Any) -> int:
        raise RuntimeError("boom\nsecond line")

    args = argparse.Namespace(
        func=broken, command="x", prefix="{flow}", redis_url=None, redis_url_file=None
    )
    assert dispatch(args) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err == "error: internal error, please report it: RuntimeError: boom second line\n"


def test_an_unreadable_flow_file_is_one_line(redis_url: str, tmp_path: Path, capsys: Any) -> None:
    missing = tmp_path / "missing.flow"
    code, err = run(capsys, "run", str(missing), "--redis-url", redis_url)
    assert (code, err) == (EXIT_ERROR, f"error: cannot read {missing}: No such file or directory\n")


def test_python_m_lifecycle_worker_serves_wait_tasks(
    processes: Processes, redis_url: str, tmp_path: Path
) -> None:
    flow = tmp_path / "waits.flow"
    flow.write_text("wait:delay (- duration: 0.1 -)", encoding="utf-8")
    processes.lifecycle("lc-1")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "lifecycle", "run", str(flow), "--wait", "--timeout", "60"]
        + ["--redis-url", redis_url],
        capture_output=True,
        timeout=90,
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert time.monotonic() - started < 60
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.xlen(Keys().tasks("wait")) == 1
    finally:
        client.close()


def test_the_redis_url_can_come_from_a_file_and_never_shows_its_password(
    redis_url: str, tmp_path: Path, capsys: Any
) -> None:
    secret = tmp_path / "redis-url"
    secret.write_text(redis_url + "\n")
    code, _ = run(capsys, "list", "--redis-url-file", str(secret))
    assert code == EXIT_OK
    wrong = tmp_path / "wrong-url"
    wrong.write_text("redis://user:s3cr#t/pw@127.0.0.1:1/0\n")
    code, err = run(capsys, "list", "--redis-url-file", str(wrong))
    assert code == EXIT_ERROR and "s3cr" not in err and "***" in err


def test_a_reader_that_goes_away_is_not_an_error(redis_url: str) -> None:
    """`status | head -1`: the command stops writing, says nothing on stderr."""
    reader = subprocess.Popen(
        [sys.executable, "-m", "lifecycle", "status", "--redis-url", redis_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.close()  # before the command writes: its first write meets a closed pipe
    err = reader.stderr.read().decode()
    reader.wait(timeout=30)
    assert err == ""
