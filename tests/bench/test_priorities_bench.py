"""A tiny run of bench.priorities: it finishes, and its figures say what priorities
promise (a high-priority task waits at most the batch in hand; no priority starves)."""

from __future__ import annotations

import re

import pytest


def test_a_high_priority_task_waits_at_most_one_batch_and_low_ones_keep_their_share(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.priorities import main

    assert main(["--backlog", "1000", "--work-us", "0", "--batch", "1", "20"]) == 0
    out = capsys.readouterr().out
    overtaken = [int(n) for n in re.findall(r"(\d+) priority-0 tasks started meanwhile", out)]
    assert len(overtaken) == 2 and overtaken[0] <= 1 and overtaken[1] <= 20
    assert (
        re.findall(r"of the first 200 tasks, 100 priority 5 and 100 priority 0", out)
        == ["of the first 200 tasks, 100 priority 5 and 100 priority 0"] * 2
    )
