import logging

import pytest
import redis

from rqse import ConfigurationError, EventClient, RedisSettings, RedisUnavailable, mask_url
from rqse.connection import is_transient


def resolve(env=None, **kw):
    return RedisSettings.resolve(env=env or {}, **kw)


def test_an_explicit_url_wins_over_the_environment():
    settings = resolve(url="redis://db:6380/2", env={"REDIS_URL": "redis://other:1"})
    assert settings.url == "redis://db:6380/2"


def test_host_and_port_arguments_win_over_the_environment():
    settings = resolve(host="10.0.0.5", port=7000, env={"REDIS_URL": "redis://other:1"})
    assert settings.url == "redis://10.0.0.5:7000"


def test_redis_url_comes_before_the_seed_variables():
    env = {"REDIS_URL": "rediss://cache:6390/0", "REDIS_HOST": "ignored", "REDIS_PORT": "1"}
    assert resolve(env=env).url == "rediss://cache:6390/0"


def test_the_seed_variables_are_used_when_there_is_no_url():
    env = {
        "REDIS_HOST": "redis.internal",
        "REDIS_PORT": "6390",
        "REDIS_USERNAME": "worker",
        "REDIS_PASSWORD": "s3cret",
    }
    settings = resolve(env=env)
    assert settings.url == "redis://redis.internal:6390"
    assert (settings.username, settings.password) == ("worker", "s3cret")
    assert "s3cret" not in repr(settings)


def test_the_default_is_the_local_server():
    assert resolve().url == "redis://127.0.0.1:6379"


def test_unix_socket_urls_are_accepted():
    settings = resolve(url="unix:///run/redis.sock?db=1")
    pool = settings.pool()
    assert pool.connection_class is redis.UnixDomainSocketConnection
    assert pool.connection_kwargs["path"] == "/run/redis.sock"


def test_an_unsupported_scheme_is_a_clear_error_naming_it():
    expected = r"unsupported Redis URL scheme 'http' from REDIS_URL"
    with pytest.raises(ConfigurationError, match=expected):
        resolve(env={"REDIS_URL": "http://localhost:6379"})


def test_a_bare_host_name_as_url_says_to_use_host():
    with pytest.raises(ConfigurationError, match="pass host="):
        EventClient("k", "localhost")


def test_explicit_credentials_win_over_those_in_the_url():
    settings = resolve(url="redis://u:p@h:1/0", password="explicit")
    assert settings.pool().connection_kwargs["password"] == "explicit"


def test_passwords_are_masked_in_urls_and_messages():
    assert mask_url("redis://user:hunter2@host:6379/0") == "redis://user:***@host:6379/0"
    assert mask_url("redis://host:6379") == "redis://host:6379"
    with pytest.raises(ConfigurationError) as caught:
        resolve(env={"REDIS_URL": "ftp://user:hunter2@host"})
    assert "hunter2" not in str(caught.value)


def test_an_unreachable_server_raises_redis_unavailable_without_the_password(caplog):
    caplog.set_level(logging.DEBUG)
    client = EventClient("k", url="redis://me:hunter2@127.0.0.1:1/0")
    with pytest.raises(RedisUnavailable) as caught:
        client.append({"kind": "x"})
    assert "hunter2" not in str(caught.value)
    assert "127.0.0.1:1" in str(caught.value)
    assert "hunter2" not in caplog.text
    assert is_transient(caught.value)


def test_settings_are_read_when_a_client_is_built_not_at_import(monkeypatch, redis_url):
    monkeypatch.setenv("REDIS_URL", redis_url)
    client = EventClient("k")
    assert client.location == redis_url
    client.close()
