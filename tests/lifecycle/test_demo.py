"""python -m lifecycle demo: the built-in flow runs end to end on an embedded server, and a
bad input is refused in one line before any server starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from flowstream.cli import main
from lifecycle.cli import EXIT_ERROR, EXIT_OK


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
