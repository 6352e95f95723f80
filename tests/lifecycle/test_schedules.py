"""Schedules: fire-time arithmetic, each fire time started once by N lifecycle workers,
the overlap and catch-up policies, the schedule commands and their one-line errors.

Policies are driven through :meth:`Schedules.fire_due` with a chosen ``now`` (the
pump's own step, with an injected clock), so "the workers were down for ten
minutes" takes no ten minutes; the soak tests run real lifecycle workers on Redis's
clock (``FLOWSTREAM_SCHEDULE_SOAK_S`` seconds each, default 4).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle import records as rec
from lifecycle.cli import main
from lifecycle.client import Client
from lifecycle.keys import Keys
from lifecycle.schedules import CATCH_UP_CAP, Schedule, ScheduleError, Schedules, run_id
from lifecycle.worker import LifecycleWorker
from tests.conftest import wait_until
from workers.noop import NoopWorker
from workers.wait import WaitWorker

KEYS = Keys()
QUICK = "@flow quick\nstep\n"
SLOW = "@flow slow\nwait:delay (- duration: 60 -)\n"
MINUTE = 60_000
SOAK_S = float(os.environ.get("FLOWSTREAM_SCHEDULE_SOAK_S", "4"))


def ms(text: str, zone: str = "UTC") -> int:
    moment = datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone))
    return round(moment.timestamp() * 1000)


def local(at_ms: int, zone: str) -> str:
    return datetime.fromtimestamp(at_ms / 1000, ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S%z")


def spec(name: str = "s", **options: Any) -> Schedule:
    options.setdefault("every_ms", MINUTE)
    return Schedule(name=name, graph="h", flow=None, file="f.flow", **options)


def add(client: redis.Redis, text: str, name: str = "s", at: int = 0, **options: Any) -> int:
    """Add a schedule of ``text`` as if at ``at`` (ms); its first fire time."""
    graph = compile_text(text, "t.flow")
    options.setdefault("every_ms", MINUTE)
    schedule = Schedule(
        name=name, graph=graph.content_hash(), flow=graph.name, file="t.flow", **options
    )
    return Schedules(client, KEYS).add(schedule, graph, now_ms=at)


def starts(client: redis.Redis) -> Counter[str]:
    """How many start-workflow events the lifecycle stream holds per workflow id."""
    counted: Counter[str] = Counter()
    for _, fields in client.xrange(KEYS.lifecycle):  # type: ignore[union-attr]
        if orjson.loads(fields[b"kind"]) == "start-workflow":
            counted[orjson.loads(fields[b"workflow"])] += 1
    return counted


def state_of(client: redis.Redis, workflow_id: str) -> str | None:
    found = Client(client, KEYS).statuses([workflow_id])[0]
    return found.state if found is not None else None


def run_cli(argv: list[str], url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main([*argv, "--redis-url", url])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def lifecycle(pool: redis.ConnectionPool, in_threads: Any) -> None:
    """A lifecycle worker without its schedule pump (the test fires), a wait: worker
    and a no-op worker for the rest."""
    in_threads(
        LifecycleWorker(pool=pool, handle_signals=False, block_ms=100, schedules=False),
        WaitWorker(pool=pool, block_ms=100, poll_interval=0.05),
        NoopWorker(["default"], pool=pool, handle_signals=False, block_ms=100),
    )


# -- fire times ----------------------------------------------------------------------


def test_cron_fire_times_follow_the_time_zone_and_croniters_dst_rules() -> None:
    berlin = spec(cron="30 2 * * *", every_ms=None, timezone="Europe/Berlin")
    # 2026-03-29: 02:30 does not exist in Berlin; croniter fires at the first time after.
    spring = berlin.next_after(ms("2026-03-28T12:00:00", "Europe/Berlin"))
    assert local(spring, "Europe/Berlin") == "2026-03-29 03:00:00+0200"
    after = berlin.next_after(spring)
    assert local(after, "Europe/Berlin") == "2026-03-30 02:30:00+0200"
    # 2026-10-25: 02:30 happens twice, and croniter fires at both (summer, then winter).
    autumn = berlin.next_after(ms("2026-10-24T12:00:00", "Europe/Berlin"))
    again = berlin.next_after(autumn)
    assert local(autumn, "Europe/Berlin") == "2026-10-25 02:30:00+0200"
    assert local(again, "Europe/Berlin") == "2026-10-25 02:30:00+0100"
    assert again - autumn == 3_600_000 and run_id("s", autumn) != run_id("s", again)
    assert local(berlin.next_after(again), "Europe/Berlin") == "2026-10-26 02:30:00+0100"
    # Nine in the morning in New York is 14:00 UTC in winter, 13:00 in summer.
    york = spec(cron="0 9 * * *", every_ms=None, timezone="America/New_York")
    assert york.next_after(ms("2026-01-10T00:00:00")) == ms("2026-01-10T14:00:00")
    assert york.next_after(ms("2026-07-10T00:00:00")) == ms("2026-07-10T13:00:00")


def test_six_field_cron_has_seconds_first_and_every_aligns_to_the_epoch() -> None:
    seconds = spec(cron="*/10 * * * * *", every_ms=None)
    start = ms("2026-05-01T10:00:03")
    assert seconds.next_after(start) == ms("2026-05-01T10:00:10")
    assert list(zip(range(3), seconds.fires_back(ms("2026-05-01T10:00:20")), strict=False)) == [
        (0, ms("2026-05-01T10:00:20")),
        (1, ms("2026-05-01T10:00:10")),
        (2, ms("2026-05-01T10:00:00")),
    ]
    every = spec(every_ms=30_000)
    assert every.next_after(ms("2026-05-01T10:00:29")) == ms("2026-05-01T10:00:30")
    assert every.next_after(ms("2026-05-01T10:00:30")) == ms("2026-05-01T10:01:00")
    assert every.when == "every 30s"


def test_run_ids_name_the_schedule_and_the_fire_time() -> None:
    assert run_id("nightly", ms("2026-11-25T02:00:00")) == "nightly@2026-11-25T02:00:00Z"
    assert run_id("n", ms("2026-11-25T02:00:00") + 7) == "n@2026-11-25T02:00:00.007Z"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"name": "no spaces"}, "schedule name 'no spaces'"),
        ({"cron": "61 * * * *", "every_ms": None}, "--cron '61 * * * *'"),
        ({"cron": "* * *", "every_ms": None}, "3 fields, expected 5"),
        ({"cron": "0 0 30 2 *", "every_ms": None}, "matches no date, never fires"),
        ({"timezone": "Mars/Olympus"}, "--timezone 'Mars/Olympus': unknown time zone"),
        ({"every_ms": 500}, "expected at least 1s"),
        ({"overlap": "queue"}, "--overlap 'queue'"),
    ],
)
def test_a_bad_definition_is_refused_naming_the_value(options: dict[str, Any], says: str) -> None:
    name = options.pop("name", "s")
    with pytest.raises(ScheduleError, match=".*") as raised:
        spec(name, **options)
    assert says in str(raised.value)


# -- each fire time once -------------------------------------------------------------


@pytest.mark.parametrize("workers", [2, 3])
def test_n_lifecycle_workers_start_each_fire_time_of_a_one_second_schedule_once(
    workers: int, redis_client: redis.Redis, pool: redis.ConnectionPool, in_threads: Any
) -> None:
    now = Schedules(redis_client, KEYS).now()
    # allow and all: what is measured is the firing, not how soon each run ends, nor
    # whether a stalled pump (2 cores, shared) found a fire time late.
    both = {"overlap": "allow", "catch_up": "all"}
    add(redis_client, QUICK, "tick", now, every_ms=1000, **both)
    add(redis_client, QUICK, "cron", now, cron="* * * * * *", every_ms=None, **both)
    in_threads(
        *(LifecycleWorker(pool=pool, handle_signals=False, block_ms=100) for _ in range(workers)),
        NoopWorker(["default"], pool=pool, handle_signals=False, block_ms=100),
    )
    time.sleep(SOAK_S)
    for name in ("tick", "cron"):
        Schedules(redis_client, KEYS).pause(name)
    counted = starts(redis_client)
    for name in ("tick", "cron"):
        ids = [i for i in counted if i.startswith(f"{name}@")]
        assert all(counted[i] == 1 for i in ids), counted
        fired = sorted(datetime.fromisoformat(i.split("@")[1]) for i in ids)
        assert len(fired) >= SOAK_S - 1, f"{name}: {fired}"
        gaps = {(b - a).total_seconds() for a, b in zip(fired, fired[1:], strict=False)}
        assert gaps == {1.0}, f"{name}: a fire time was missed: {fired}"
        record = redis_client.hgetall(KEYS.schedule(name))
        assert int(record[rec.SCHEDULE_FIRED.encode()]) == len(ids)
    wait_until(
        lambda: all(state_of(redis_client, i) == "finished" for i in counted),
        what="every scheduled run to finish",
    )


# -- overlap -------------------------------------------------------------------------


def test_overlap_skip_starts_nothing_while_the_last_run_runs(
    redis_client: redis.Redis, lifecycle: None
) -> None:
    first = add(redis_client, SLOW, overlap="skip")
    schedules = Schedules(redis_client, KEYS)
    assert schedules.fire_due(first) == 1
    one = run_id("s", first)
    wait_until(lambda: state_of(redis_client, one) == "running", what="the first run")
    assert schedules.fire_due(first + MINUTE) == 0
    assert state_of(redis_client, one) == "running"
    assert redis_client.hget(KEYS.schedule("s"), rec.SCHEDULE_SKIPPED) == b"1"
    # Once it ended, the next fire time starts again.
    Client(redis_client, KEYS).terminate(one, wait=5)
    assert schedules.fire_due(first + 2 * MINUTE) == 1
    assert starts(redis_client).keys() == {one, run_id("s", first + 2 * MINUTE)}


def test_a_last_run_whose_start_never_applied_stops_blocking_after_a_minute(
    redis_client: redis.Redis,
) -> None:
    first = add(redis_client, QUICK, overlap="skip", every_ms=20_000)
    schedules = Schedules(redis_client, KEYS)
    assert schedules.fire_due(first) == 1  # no lifecycle worker: its start stays queued
    assert schedules.fire_due(first + 20_000) == 0  # a queued start counts as running
    # A minute on with no record, the start was refused (it never ran): no overlap.
    assert schedules.fire_due(first + 80_000) == 1


def test_overlap_cancel_previous_terminates_the_last_run_then_starts(
    redis_client: redis.Redis, lifecycle: None
) -> None:
    first = add(redis_client, SLOW, overlap="cancel-previous")
    schedules = Schedules(redis_client, KEYS)
    schedules.fire_due(first)
    one, two = run_id("s", first), run_id("s", first + MINUTE)
    wait_until(lambda: state_of(redis_client, one) == "running", what="the first run")
    assert schedules.fire_due(first + MINUTE) == 1
    wait_until(lambda: state_of(redis_client, one) == "terminated", what="the first run's end")
    wait_until(lambda: state_of(redis_client, two) == "running", what="the second run")
    error = Client(redis_client, KEYS).status(one).error or ""
    assert f"overlapped by its run {two}" in error


def test_overlap_allow_starts_while_the_last_run_runs(
    redis_client: redis.Redis, lifecycle: None
) -> None:
    first = add(redis_client, SLOW, overlap="allow")
    schedules = Schedules(redis_client, KEYS)
    schedules.fire_due(first)
    wait_until(lambda: state_of(redis_client, run_id("s", first)) == "running", what="run 1")
    assert schedules.fire_due(first + MINUTE) == 1
    both = [run_id("s", first), run_id("s", first + MINUTE)]
    wait_until(lambda: all(state_of(redis_client, i) == "running" for i in both), what="both")


# -- catch-up ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "caught_up"), [("none", []), ("one", [10]), ("all", list(range(11)))]
)
def test_catch_up_after_the_workers_were_down_ten_minutes(
    policy: str, caught_up: list[int], redis_client: redis.Redis
) -> None:
    first = add(redis_client, QUICK, catch_up=policy)
    # Every minute from `first` to first + 10 min fell due while no worker ran; the
    # worker that comes back finds them 30 s after the last one.
    back = first + 10 * MINUTE + 30_000
    started = Schedules(redis_client, KEYS).fire_due(back)
    assert started == len(caught_up)
    assert set(starts(redis_client)) == {run_id("s", first + n * MINUTE) for n in caught_up}
    record = redis_client.hgetall(KEYS.schedule("s"))
    assert int(record[rec.SCHEDULE_NEXT.encode()]) == first + 11 * MINUTE
    assert int(record.get(rec.SCHEDULE_SKIPPED.encode(), 0)) == 11 - len(caught_up)


@pytest.mark.parametrize("policy", ["none", "all"])
def test_catch_up_when_the_only_lifecycle_worker_stops_and_another_starts(
    policy: str, redis_client: redis.Redis, pool: redis.ConnectionPool
) -> None:
    add(
        redis_client,
        QUICK,
        "tick",
        Schedules(redis_client, KEYS).now(),
        every_ms=1000,
        catch_up=policy,
        overlap="allow",
    )

    def fired() -> list[datetime]:
        ids = [i for i in starts(redis_client) if i.startswith("tick@")]
        return sorted(datetime.fromisoformat(i.split("@")[1]) for i in ids)

    def worker() -> tuple[LifecycleWorker, threading.Thread]:
        listener = LifecycleWorker(pool=pool, handle_signals=False, block_ms=100)
        thread = threading.Thread(target=listener.listen, daemon=True)
        thread.start()
        return listener, thread

    first, thread = worker()
    wait_until(lambda: len(fired()) >= 1, what="a first run")
    first.stop()
    thread.join(10)
    before = fired()
    time.sleep(3.2)  # three or four fire times pass with no worker
    second, thread = worker()
    try:
        wait_until(lambda: len(fired()) > len(before), what="a run after the restart")
    finally:
        Schedules(redis_client, KEYS).pause("tick")
        second.stop()
        thread.join(10)
    after = fired()
    gaps = [(b - a).total_seconds() for a, b in zip(after, after[1:], strict=False)]
    if policy == "all":
        assert set(gaps) == {1.0}, after  # every missed fire time started
    else:
        assert max(gaps) >= 3.0, after  # the missed ones did not; the on-time one did
        assert (after[-1] - before[-1]).total_seconds() >= 3.0


def test_catch_up_all_starts_at_most_the_latest_hundred(redis_client: redis.Redis) -> None:
    first = add(redis_client, QUICK, catch_up="all", every_ms=1000)
    assert Schedules(redis_client, KEYS).fire_due(first + 499_000) == CATCH_UP_CAP
    started = sorted(starts(redis_client))
    assert started[0] == run_id("s", first + 400_000)
    assert started[-1] == run_id("s", first + 499_000)


def test_schedules_falling_due_together_all_start_however_many_batches_they_take(
    redis_client: redis.Redis,
) -> None:
    # More than one batch due at once, under catch-up none: those fired last are judged
    # by the clock read first, so none is counted missed for the time the others took.
    for n in range(250):
        first = add(redis_client, QUICK, f"s{n:03}", catch_up="none", overlap="allow")
    assert Schedules(redis_client, KEYS).fire_due(first + 4000, batch=100) == 250
    assert len(starts(redis_client)) == 250


def test_catch_up_all_of_a_large_input_keeps_the_latest_runs_that_fit_one_call(
    redis_client: redis.Redis,
) -> None:
    big = "x" * (7 << 20)  # 7 MiB, under the input limit: nine runs fit in 64 MiB
    first = add(redis_client, QUICK, catch_up="all", every_ms=1000, input=big)
    assert Schedules(redis_client, KEYS).fire_due(first + 11_000) == 9
    kept = [run_id("s", first + n * 1000) for n in range(3, 12)]
    assert sorted(starts(redis_client)) == sorted(kept)
    record = redis_client.hgetall(KEYS.schedule("s"))
    assert int(record[rec.SCHEDULE_SKIPPED.encode()]) == 3


def test_a_fire_time_found_late_by_less_than_the_grace_starts_under_catch_up_none(
    redis_client: redis.Redis,
) -> None:
    first = add(redis_client, QUICK, catch_up="none")
    assert Schedules(redis_client, KEYS).fire_due(first + 2000) == 1


def test_a_second_worker_firing_the_same_fire_time_starts_nothing(
    redis_client: redis.Redis,
) -> None:
    first = add(redis_client, QUICK)
    one, other = Schedules(redis_client, KEYS), Schedules(redis_client, KEYS)
    stale = other.plan("s", first)  # read before the first worker fires
    assert stale is not None and len(stale.runs) == 1
    assert one.fire("s", first).started == 1
    assert other.apply(stale).moved
    assert one.fire_due(first) == 0
    assert sum(starts(redis_client).values()) == 1


# -- the commands --------------------------------------------------------------------


def test_schedule_commands_add_list_pause_resume_run_now_and_remove(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    flow = tmp_path / "slow.flow"
    flow.write_text(SLOW)
    code, out, _ = run_cli(
        [
            "schedule",
            "add",
            "nightly",
            str(flow),
            "--cron",
            "0 2 * * *",
            "--priority",
            "5",
            "--concurrency-key",
            "reports",
            "--max-running",
            "2",
            "--input",
            '{"a": 1}',
        ],
        redis_url,
        capsys,
    )
    assert code == 0 and out.startswith("schedule nightly: 0 2 * * *, first run nightly@")
    code, out, _ = run_cli(["schedule", "list", "--json"], redis_url, capsys)
    [row] = orjson.loads(out)
    assert (row["name"], row["flow"], row["overlap"], row["catch_up"]) == (
        "nightly",
        "slow",
        "skip",
        "one",
    )
    assert row["next"].endswith("02:00:00+00:00") and row["last_run"] is None
    assert row["priority"] == 5  # stored for the start, which passes it on
    assert (row["concurrency_key"], row["max_running"]) == ("reports", 2)

    assert run_cli(["schedule", "pause", "nightly"], redis_url, capsys)[1] == (
        "schedule nightly: paused\n"
    )
    assert Schedules(redis_client, KEYS).fire_due(ms("2100-01-01T00:00:00")) == 0
    code, out, _ = run_cli(["schedule", "list"], redis_url, capsys)
    assert "\tpaused\t" in out.splitlines()[1]

    code, out, _ = run_cli(["schedule", "run-now", "nightly"], redis_url, capsys)
    workflow_id = out.strip()
    assert code == 0 and workflow_id.startswith("nightly@")
    assert starts(redis_client).keys() == {workflow_id}
    [(_, start)] = redis_client.xrange(KEYS.lifecycle)  # type: ignore[misc]
    assert orjson.loads(start[b"input"]) == {"a": 1}  # the input given at add
    assert orjson.loads(start[b"priority"]) == 5  # and its priority, whose streams are named
    assert redis_client.smembers(KEYS.priorities) == {b"wait:5"}
    # and its place under its concurrency key
    assert orjson.loads(start[b"concurrency_key"]) == "reports"
    assert orjson.loads(start[b"max_running"]) == 2
    # Its last run has not ended (nothing runs the lifecycle here): overlap skip holds.
    code, out, _ = run_cli(["schedule", "run-now", "nightly"], redis_url, capsys)
    assert code == 1 and f"its last run {workflow_id} still runs" in out

    code, out, _ = run_cli(["schedule", "resume", "nightly"], redis_url, capsys)
    assert code == 0 and "resumed, next run nightly@" in out
    code, out, _ = run_cli(["list", "--schedule", "nightly", "--json"], redis_url, capsys)
    assert code == 0  # the start is not applied yet: no record, so no row
    code, out, _ = run_cli(["schedule", "remove", "nightly"], redis_url, capsys)
    assert code == 0 and run_cli(["schedule", "list", "--json"], redis_url, capsys)[1] == "[]\n"
    assert not redis_client.exists(KEYS.schedule("nightly"), KEYS.schedule_runs("nightly"))


def test_list_schedule_shows_only_that_schedules_runs(
    redis_client: redis.Redis,
    redis_url: str,
    lifecycle: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = add(redis_client, QUICK, "a")
    add(redis_client, QUICK, "b")
    Schedules(redis_client, KEYS).fire_due(first)
    ids = {run_id("a", first), run_id("b", first)}
    wait_until(lambda: all(state_of(redis_client, i) == "finished" for i in ids), what="runs")
    code, out, _ = run_cli(["list", "--schedule", "a", "--json"], redis_url, capsys)
    assert code == 0 and [row["id"] for row in orjson.loads(out)] == [run_id("a", first)]
    code, out, _ = run_cli(["schedule", "list", "--json"], redis_url, capsys)
    assert [(r["last_run"], r["last_state"]) for r in orjson.loads(out)] == [
        (run_id("a", first), "finished"),
        (run_id("b", first), "finished"),
    ]


def test_runs_that_retention_removed_leave_the_schedules_index_at_its_next_fire(
    redis_client: redis.Redis,
) -> None:
    first = add(redis_client, QUICK, overlap="allow")
    schedules = Schedules(redis_client, KEYS)
    schedules.fire_due(first)
    gone = run_id("s", first)
    redis_client.zrem(KEYS.workflows, gone)  # what expire.lua does with a removed workflow
    schedules.fire_due(first + MINUTE)
    assert schedules.runs("s") == [run_id("s", first + MINUTE)]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["add", "bad name", "F", "--every", "1s"], "schedule name 'bad name'"),
        (["add", "n", "F", "--cron", "0 25 * * *"], "--cron '0 25 * * *'"),
        (["add", "n", "F", "--cron", "0 2 * * *", "--timezone", "Nowhere/X"], "Nowhere/X"),
        (["add", "n", "F", "--every", "soon"], "'soon' is not a duration"),
        (["add", "n", "F", "--every", "100000000d"], "at most 3650 days"),
        (["add", "n", "BROKEN", "--every", "1s"], "broken.flow:2:"),
        (["add", "n", "F", "--every", "1s", "--priority", "10"], "--priority: 10 is out of range"),
        (["add", "n", "F", "--every", "1s", "--max-running", "2"], "concurrency key None"),
        (["pause", "missing"], "no schedule 'missing'"),
        (["run-now", "missing"], "no schedule 'missing'"),
    ],
)
def test_bad_schedule_input_is_one_line_and_exit_2(
    argv: list[str],
    says: str,
    tmp_path: Path,
    redis_url: str,
    redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    good, broken = tmp_path / "good.flow", tmp_path / "broken.flow"
    good.write_text(QUICK)
    broken.write_text("@flow broken\na → → b\n")
    files = {"F": str(good), "BROKEN": str(broken)}
    code, out, err = run_cli(["schedule", *(files.get(a, a) for a in argv)], redis_url, capsys)
    assert code == 2, err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert not redis_client.exists(KEYS.schedules)


def test_adding_a_name_twice_is_refused(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    flow = tmp_path / "q.flow"
    flow.write_text(QUICK)
    argv = ["schedule", "add", "n", str(flow), "--every", "1m"]
    assert run_cli(argv, redis_url, capsys)[0] == 0
    code, _, err = run_cli(argv, redis_url, capsys)
    assert code == 2 and "schedule 'n' exists" in err
