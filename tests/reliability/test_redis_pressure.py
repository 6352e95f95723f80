"""Scenarios 4 and 5: Redis out of memory (noeviction) and a faulty network.

Under ``maxmemory`` with ``noeviction`` every write fails with OOM while reads
go on: the workers must keep their events pending and retry, dead-letter
nothing, and go on once memory is raised. Through a TCP proxy that resets every
connection, stalls, and refuses connections for a while, the workers must
reconnect by themselves and finish everything exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from lifecycle.kind_limits import set_kind_limit
from rqse.keys import dead_letter_key
from tests.reliability.helpers import (
    KEYS,
    Engine,
    check_exactly_once,
    record,
    size,
    submit,
    wait_all_ended,
    wait_progress,
)
from tests.rqse.proxy import Proxy

WORKFLOWS = size(2000, 20_000)


def ended(engine: Engine) -> int:
    return sum(int(v) for v in engine.client.hgetall(KEYS.outcomes).values())


def oom_errors(engine: Engine) -> int:
    stats = engine.client.info("errorstats")
    return int(stats.get("errorstat_OOM", {}).get("count", 0))


def dead_lettered(engine: Engine) -> int:
    streams = [KEYS.lifecycle, KEYS.tasks("default")]
    return sum(engine.client.xlen(dead_letter_key(stream)) for stream in streams)


class DeadLettered(AssertionError):
    """Something was dead-lettered: under OOM nothing may be."""


def no_dead_letters(engine: Engine) -> None:
    """Fail at once, with the first letter's reason, when anything was dead-lettered."""
    for stream in (KEYS.lifecycle, KEYS.tasks("default")):
        for _, fields in engine.client.xrange(dead_letter_key(stream), count=1):
            reason = fields[b"reason"].decode()
            raise DeadLettered(f"{stream}: dead-lettered ({reason}): {fields[b'error'].decode()}")


@pytest.mark.parametrize(
    ("kind_limit", "pack_starts"),
    [(None, False), (1_000_000, False), (None, True)],
    ids=["unlimited", "kind-limited", "unlimited-packed-starts"],
)
def test_redis_out_of_memory_for_a_while_dead_letters_nothing_and_everything_finishes(
    engine_factory: Callable[..., Engine], kind_limit: int | None, pack_starts: bool
) -> None:
    engine = engine_factory("none", ["--maxmemory-policy", "noeviction"], pack_starts=pack_starts)
    if kind_limit is not None:  # the workers take and release slots in the squeeze too
        set_kind_limit(engine.client, KEYS, "default", kind_limit)
    ids, expected = submit(engine.client, WORKFLOWS)
    running = [engine.lifecycle("lifecycle-0"), engine.noop("noop-0"), engine.noop("noop-1")]
    wait_progress(engine.client, WORKFLOWS, 0.2)
    cap = engine.client.info("memory")["used_memory"] + 16 * 1024
    engine.client.config_set("maxmemory", cap)  # full within a moment
    # A 10 s squeeze showed the dead letters in two runs of three, 20 s in three of three.
    squeeze = size(20, 60)
    began = time.monotonic()
    at_squeeze = ended(engine)
    while time.monotonic() - began < squeeze:
        assert not (exited := engine.exited(running)), f"a worker exited under OOM: {exited}"
        time.sleep(0.2)
        # Client buffers freed after the submissions make room: keep the cap just above
        # what is used, so that the squeeze lasts.
        used = engine.client.info("memory")["used_memory"]
        if used + 16 * 1024 < cap:
            cap = used + 16 * 1024
            engine.client.config_set("maxmemory", cap)
    at_release = ended(engine)
    rejected = oom_errors(engine)
    engine.client.config_set("maxmemory", 0)
    released = time.monotonic()
    packed = "-packed-starts" if pack_starts else ""
    record(
        "redis-oom-squeeze" + packed,
        workflows=WORKFLOWS,
        squeeze_seconds=squeeze,
        ended_during_squeeze=at_release - at_squeeze,
        oom_errors=rejected,
        dead_letters_during_squeeze=dead_lettered(engine),
    )
    assert rejected > 0, "Redis never refused a write: the squeeze did not bite"
    no_dead_letters(engine)
    found = wait_all_ended(
        engine.client, ids, timeout=size(90, 900), during=lambda: no_dead_letters(engine)
    )
    assert not (exited := engine.exited(running)), f"a worker exited: {exited}"
    assert dead_lettered(engine) == 0
    counts = check_exactly_once(engine.client, found, expected)
    record(
        "redis-oom" + packed,
        squeeze_seconds=squeeze,
        ended_during_squeeze=at_release - at_squeeze,
        oom_errors=rejected,
        seconds_after_release=round(time.monotonic() - released, 1),
        dead_letters=0,
        **counts,
    )


def test_connections_reset_stalled_and_refused_the_workers_reconnect_and_finish_once(
    engine_factory: Callable[..., Engine],
) -> None:
    engine = engine_factory()
    proxy = Proxy(engine.server.port)
    try:
        ids, expected = submit(engine.client, WORKFLOWS)
        running = [
            engine.lifecycle("lifecycle-0", url=proxy.url),
            engine.noop("noop-0", url=proxy.url),
            engine.noop("noop-1", url=proxy.url),
        ]
        wait_progress(engine.client, WORKFLOWS, 0.2)
        faults = []
        began = time.monotonic()
        for _ in range(3):  # resets, as when a firewall or a failover drops connections
            proxy.drop()
            faults.append("reset")
            time.sleep(0.5)
        proxy.stall()  # a partition: connections open, no byte moves
        time.sleep(size(3, 10))
        proxy.resume()
        faults.append("stall")
        proxy.down()  # nothing listens: connections refused
        time.sleep(2)
        proxy.up()
        faults.append("refused")
        healed = time.monotonic()
        found = wait_all_ended(
            engine.client, ids, timeout=size(90, 900), during=lambda: no_dead_letters(engine)
        )
        assert not (exited := engine.exited(running)), f"a worker exited: {exited}"
        # A reply lost with its connection costs no delivery either (noted at recovery).
        assert dead_lettered(engine) == 0
        counts = check_exactly_once(engine.client, found, expected)
        record(
            "network-faults",
            faults=faults,
            fault_seconds=round(healed - began, 1),
            seconds_after_heal=round(time.monotonic() - healed, 1),
            dead_letters=dead_lettered(engine),
            **counts,
        )
    finally:
        proxy.close()
