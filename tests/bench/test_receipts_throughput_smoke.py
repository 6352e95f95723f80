"""The receipts benchmark keeps working (tiny runs; no timing is asserted)."""

import orjson
import pytest

from bench.receipts_throughput import main


def test_a_tiny_backlog_run_archives_every_event_and_extrapolates_the_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["backlog", "--sizes", "2000", "4000", "--target", "10000"]) == 0
    figures = orjson.loads(capsys.readouterr().out)
    assert [run["events"] for run in figures["runs"]] == [2000, 4000]
    assert figures["extrapolated_from"] == 4000
    assert figures["catch_up_10000_s_extrapolated"] > 0
    for key in ("worker_cpu_us_per_event", "redis_cpu_us_per_event", "events_per_cpu_s"):
        assert figures["runs"][0][key] > 0
