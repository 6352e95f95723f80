"""rqse.pump: fires what is due by Redis's clock, once, and rides out Redis refusing writes."""

from __future__ import annotations

import logging

import pytest
import redis

from rqse.pump import Pump
from tests.conftest import wait_until

# Moves due members of KEYS[1] to the stream KEYS[2]; the contract Pump calls.
FIRE = """
local now = tonumber(ARGV[1])
if not now then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  redis.call('XADD', KEYS[2], '*', 'member', member)
  redis.call('ZREM', KEYS[1], member)
end
return #due
"""


def _pump(client: redis.Redis, **options: object) -> Pump:
    return Pump(client.register_script(FIRE), ["due", "fired"], name="test-pump", **options)  # type: ignore[arg-type]


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_only_what_is_due_by_redis_clock_fires_in_batches(redis_client: redis.Redis) -> None:
    now = _redis_ms(redis_client)
    redis_client.zadd("due", {f"past-{n}": now - 1000 for n in range(7)})
    redis_client.zadd("due", {"future": now + 60_000})
    assert _pump(redis_client, batch=3).fire_due() == 7
    assert redis_client.xlen("fired") == 7
    assert redis_client.zrange("due", 0, -1) == [b"future"]


def test_the_pump_thread_rides_out_redis_out_of_memory_and_fires_afterwards(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    pump = _pump(redis_client, interval=0.01)
    redis_client.zadd("due", {"one": 0})
    redis_client.config_set("maxmemory", 1)  # noeviction: every write is refused
    try:
        with caplog.at_level(logging.WARNING, logger="rqse.pump"):
            pump.start()
            wait_until(lambda: "out of memory" in caplog.text, what="the weather warning")
            assert redis_client.xlen("fired") == 0
            redis_client.config_set("maxmemory", 0)
            wait_until(lambda: redis_client.xlen("fired") == 1, what="the timer to fire")
    finally:
        redis_client.config_set("maxmemory", 0)
        pump.stop()
    assert caplog.text.count("out of memory") == 1  # once per change, not per retry
