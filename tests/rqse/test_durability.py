"""server_warnings: eviction and persistence settings that put streams at risk."""

from __future__ import annotations

import logging

import pytest
import redis

from rqse import EventListener
from rqse.durability import server_warnings, warnings_for
from rqse.server import RedisServer
from tests.conftest import wait_until


@pytest.fixture
def server():
    with RedisServer(persistence="aof-everysec") as server:
        yield server


def test_a_durable_server_that_never_evicts_gets_no_warning(server):
    assert server_warnings(redis.Redis(port=server.port)) == []


def test_an_evicting_policy_with_a_memory_limit_is_a_warning(server):
    client = redis.Redis(port=server.port)
    client.config_set("maxmemory", "100mb")
    client.config_set("maxmemory-policy", "allkeys-lru")
    [warning] = server_warnings(client)
    assert "maxmemory-policy allkeys-lru" in warning and "noeviction" in warning
    client.config_set("maxmemory-policy", "volatile-ttl")
    assert "volatile-ttl" in server_warnings(client)[0]
    client.config_set("maxmemory", "0")  # no limit: nothing is ever evicted
    assert server_warnings(client) == []


def test_no_aof_and_no_save_points_is_a_warning(server):
    client = redis.Redis(port=server.port)
    client.config_set("appendonly", "no")
    [warning] = server_warnings(client)
    assert "persistence off" in warning
    client.config_set("save", "900 1")
    assert server_warnings(client) == []


def test_a_server_where_config_is_forbidden_gets_no_warning_and_no_error(server):
    admin = redis.Redis(port=server.port)
    admin.config_set("appendonly", "no")  # would be warned about, if CONFIG could be read
    admin.acl_setuser(
        "app",
        enabled=True,
        passwords=["+app-pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-config"],
    )
    app = redis.Redis(port=server.port, username="app", password="app-pw")
    with pytest.raises(redis.exceptions.NoPermissionError):
        app.config_get("save")
    assert server_warnings(app) == []


def test_warnings_are_read_from_config_get_text():
    assert warnings_for({"maxmemory": "0", "maxmemory-policy": "allkeys-lru"}) == []
    assert warnings_for({"appendonly": "no", "save": "3600 1 300 100"}) == []
    assert len(warnings_for({"appendonly": "no", "save": ""})) == 1


def test_a_listener_logs_the_warnings_once_at_start_not_per_reconnect(server, caplog, run_listener):
    client = redis.Redis(port=server.port)
    client.config_set("appendonly", "no")
    caplog.set_level(logging.WARNING, logger="rqse")

    class Quiet(EventListener):
        def process(self, event_id, event):
            return True

    listener = Quiet("jobs", "g", url=server.url, block_ms=50)
    run = run_listener(listener)
    wait_until(lambda: listener.established, what="established")
    client.client_kill_filter(_type="normal", skipme=True)  # every connection of the listener
    wait_until(lambda: listener.stats.reconnects >= 1, what="a reconnect")
    wait_until(lambda: listener.established, what="established again")
    run.stop()
    assert caplog.text.count("persistence off") == 1
