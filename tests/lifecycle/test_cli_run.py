"""python -m lifecycle run: inputs past the limits are refused before anything is stored,
and --wait ends (exit 1, with the reason) when the workflow can never finish."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from flowstream.cli import main
from lifecycle.cli import EXIT_ERROR, EXIT_FAILED
from lifecycle.keys import Keys
from rqse import EventListener
from rqse.keys import dead_letter_key


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture
def flow(tmp_path: Path) -> str:
    path = tmp_path / "one.flow"
    path.write_text("A → B", encoding="utf-8")
    return str(path)


def test_an_input_nested_past_the_limit_is_one_line_and_stores_nothing(
    redis_client: redis.Redis, redis_url: str, flow: str, capsys: Any
) -> None:
    code = main(["run", flow, "--input", nested(300), "--redis-url", redis_url])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR
    assert err == "error: --input nests deeper than 256 levels\n"
    assert redis_client.keys("*") == []


def test_an_input_file_nested_past_orjsons_own_limit_is_one_line(
    redis_client: redis.Redis, redis_url: str, flow: str, tmp_path: Path, capsys: Any
) -> None:
    for depth in (300, 5000):
        deep = tmp_path / f"deep{depth}.json"
        deep.write_text(nested(depth), encoding="utf-8")
        code = main(["run", flow, "--input", f"@{deep}", "--redis-url", redis_url])
        err = capsys.readouterr().err
        assert code == EXIT_ERROR
        assert err == f"error: {deep} nests deeper than 256 levels\n"
    assert redis_client.keys("*") == []


def test_an_input_larger_than_the_limit_is_one_line_and_stores_nothing(
    redis_client: redis.Redis, redis_url: str, flow: str, tmp_path: Path, capsys: Any
) -> None:
    big = tmp_path / "big.json"
    big.write_text('"' + "x" * (9 * 1024 * 1024) + '"', encoding="utf-8")
    code = main(["run", flow, "--input", f"@{big}", "--redis-url", redis_url])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR
    assert err.startswith(f"error: {big} is ") and "more than the limit" in err
    assert err.count("\n") == 1
    assert redis_client.keys("*") == []


class Refuser(EventListener):
    """A lifecycle consumer that fails every event: its entries are dead-lettered."""

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        raise RuntimeError("refused on purpose")


def test_run_wait_exits_1_with_the_reason_when_the_start_was_dead_lettered(
    redis_client: redis.Redis, redis_url: str, flow: str, capsys: Any
) -> None:
    keys = Keys()
    pool = redis.ConnectionPool.from_url(redis_url)
    refuser = Refuser(
        keys.lifecycle,
        keys.lifecycle_group,
        pool=pool,
        max_deliveries=1,
        block_ms=100,
        handle_signals=False,
    )
    thread = threading.Thread(target=refuser.listen, daemon=True)
    thread.start()
    try:
        code = main(
            ["run", flow, "--id", "wf-dead", "--wait", "--timeout", "30", "--redis-url", redis_url]
        )
    finally:
        refuser.stop()
        thread.join(10)
        pool.disconnect()
    err = capsys.readouterr().err
    assert code == EXIT_FAILED
    assert "workflow wf-dead dead-lettered: its start-workflow was dead-lettered" in err
    assert "refused on purpose" in err
    assert redis_client.xlen(dead_letter_key(keys.lifecycle)) == 1


def test_run_wait_ignores_dead_letters_of_other_workflows(
    redis_client: redis.Redis, redis_url: str, flow: str, capsys: Any
) -> None:
    from rqse.deadletter import dead_letter_fields

    keys = Keys()
    other = {b"kind": b'"start-workflow"', b"workflow": b'"someone-else"'}
    fields = dead_letter_fields(
        stream=keys.lifecycle,
        group=keys.lifecycle_group,
        consumer="c",
        entry_id="1-0",
        fields=other,
        reason="rejected",
        error="not mine",
        deliveries=1,
    )
    writer = threading.Timer(0.3, redis_client.xadd, (dead_letter_key(keys.lifecycle), fields))
    writer.start()
    code = main(["run", flow, "--wait", "--timeout", "1.5", "--redis-url", redis_url])
    writer.join()
    assert code == EXIT_ERROR  # no engine: it waited out its timeout
    assert "did not end within 1.5s" in capsys.readouterr().err
