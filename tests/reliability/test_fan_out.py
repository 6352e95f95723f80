"""Scenario 7: one workflow fanning out to many items (``A → * B``), and past the limit.

Up to :attr:`flowlang.limits.Limits.items` items a workflow fans out, runs every
item once and gathers the outputs in order; past it, the workflow fails with a
reason naming the limit instead of starting the tasks (or eating the lifecycle
worker's memory).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from flowlang.compiler import compile_text
from flowlang.limits import DEFAULT_LIMITS
from lifecycle.submit import start_workflow
from tests.reliability.helpers import (
    KEYS,
    Engine,
    decoded,
    peak_rss_kb,
    record,
    size,
    states,
    wait_all_ended,
)

# FLOWSTREAM_FANOUT_ITEMS: another size, to see how time and memory grow.
ITEMS = int(os.environ.get("FLOWSTREAM_FANOUT_ITEMS") or size(10_000, 1_000_000))

# The lifecycle worker's peak RSS per fanned-out item, with room to spare: 0.2-0.4 KB
# measured at 100,000 to 300,000 items, over the process's own 260 MB (docs/reliability.md).
# The run is skipped where the machine has not that much.
PEAK_KB_PER_ITEM = 2


def available_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def test_a_fan_out_to_many_items_runs_each_once_and_gathers_them_in_order(
    engine_factory: Callable[..., Engine],
) -> None:
    need = ITEMS * PEAK_KB_PER_ITEM * 1.2
    if need > available_kb():
        pytest.skip(
            f"{ITEMS:,} items need about {need / 2**20:.1f} GB for the lifecycle worker "
            f"({PEAK_KB_PER_ITEM} KB per item measured), {available_kb() / 2**20:.1f} GB free"
        )
    engine = engine_factory()
    limit = max(ITEMS, DEFAULT_LIMITS.items)
    lifecycle = engine.start(
        "lifecycle", "worker", "--max-items", str(limit), "--consumer", "fan", "--claim-idle", "1"
    )
    engine.noop("noop-0")
    engine.noop("noop-1")
    time.sleep(1)  # the workers are up: time the workflow, not their start
    began = time.monotonic()
    workflow = start_workflow(engine.client, compile_text("A → * B"), list(range(ITEMS)), "fan")
    fanned: list[float] = []  # when every item's start-task was written

    def watch() -> None:
        if not fanned and engine.client.xlen(KEYS.tasks("default")) > ITEMS:
            fanned.append(time.monotonic() - began)

    timeout = max(60, ITEMS / 100)  # 10 ms per item: far beyond what was measured
    (state,) = wait_all_ended(engine.client, [workflow], timeout, during=watch).values()
    elapsed = time.monotonic() - began
    rss = peak_rss_kb(lifecycle.pid)
    assert state["status"] == "finished", state.get("error")
    assert state["output"] == list(range(ITEMS))
    starts = [e["id"] for e in decoded(engine.client, KEYS.tasks("default"))]
    assert len(starts) == len(set(starts)) == ITEMS + 1
    record(
        "fan-out",
        items=ITEMS,
        seconds=round(elapsed, 1),
        fanned_out_after=round(fanned[0], 1) if fanned else None,
        items_per_second=round(ITEMS / elapsed),
        lifecycle_peak_rss_mb=round(rss / 1024, 1),
        redis_peak_mb=round(engine.client.info("memory")["used_memory_peak"] / 2**20, 1),
    )


def test_a_fan_out_past_the_item_limit_fails_the_workflow_with_the_reason(
    engine_factory: Callable[..., Engine],
) -> None:
    engine = engine_factory()
    engine.lifecycle("lifecycle-0")
    engine.noop("noop-0")  # answers A (kind default); nothing serves kind `big`
    too_many = DEFAULT_LIMITS.items + 1
    workflow = start_workflow(
        engine.client, compile_text("A → * big:B"), list(range(too_many)), "too-many"
    )
    deadline = time.monotonic() + 30
    while True:
        state = states(engine.client, [workflow])[workflow]
        fanned = engine.client.exists(KEYS.tasks("big")) and engine.client.xlen(KEYS.tasks("big"))
        if state.get("status") == "failed" or fanned:
            break
        assert time.monotonic() < deadline, "the workflow neither failed nor fanned out"
        time.sleep(0.2)
    assert not fanned, f"{fanned} tasks started past the limit of {DEFAULT_LIMITS.items}"
    assert state["status"] == "failed"
    assert f"{DEFAULT_LIMITS.items:,}" in str(state.get("error")), state.get("error")
