"""Expected failures of every program are one line on stderr, never a traceback: a missing
file, a bad flow, an unknown class, Redis down (a port nothing listens on)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

DOWN = "redis://127.0.0.1:{port}/0"


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def bad_flow(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("flows") / "bad.flow"
    path.write_text("A →\n", encoding="utf-8")
    return str(path)


CASES = [
    # (program and arguments, exit code, what the line says)
    (["lifecycle", "run", "missing.flow"], 2, "cannot read missing.flow"),
    (["lifecycle", "run", "{bad}"], 2, "stray arrow"),
    (["lifecycle", "run", "examples/orders.flow"], 2, "cannot reach Redis at"),
    (["lifecycle", "inspect", "some-id"], 2, "cannot reach Redis at"),
    (["lifecycle", "worker"], 2, "cannot reach Redis at"),
    (["lifecycle", "terminate", "some-id"], 2, "cannot reach Redis at"),
    (["lifecycle", "replay", "missing-archive"], 2, "no such archive directory"),
    (["lifecycle", "demo", "{bad}"], 2, "stray arrow"),
    (["workers", "simulate"], 2, "cannot reach Redis at"),
    (["workers", "run", "examples.seed_worker:StockListener"], 2, "cannot reach Redis at"),
    (["flowlang", "check", "missing.flow"], 2, "missing.flow: cannot read"),
    (["flowlang", "check", "{bad}"], 1, "stray arrow"),
]


@pytest.mark.parametrize(
    ("argv", "code", "says"), CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else None
)
def test_an_expected_failure_is_one_line_without_traceback(
    argv: list[str], code: int, says: str, bad_flow: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_")}
    env["REDIS_URL"] = DOWN.format(port=unused_port())
    argv = [bad_flow if a == "{bad}" else a for a in argv]
    done = subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=Path(__file__).parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == code, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert says in done.stderr
