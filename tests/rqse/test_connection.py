import logging

import pytest
import redis

from rqse import ConfigurationError, EventClient, RedisSettings, RedisUnavailable, mask_url
from rqse.connection import is_transient, resolve_url


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


@pytest.mark.parametrize(
    ("url", "masked", "secret"),
    [
        ("redis://user:p#ss@host:6379/0", "redis://user:***@host:6379/0", "p#ss"),
        ("redis://user:pa/ss@host:6379/0", "redis://user:***@host:6379/0", "pa/ss"),
        ("redis://user:p@ss@host:6379/0", "redis://user:***@host:6379/0", "p@ss"),
        ("redis://user:100%real@host:6379", "redis://user:***@host:6379", "100%real"),
        ("redis://:p%40ss@host:6379", "redis://:***@host:6379", "p%40ss"),
        (
            "rediss://default:a?b#c/d@e@cache.example:6390/1",
            "rediss://default:***@cache.example:6390/1",
            "a?b#c/d@e",
        ),
        ("redis://sekrit@host:6379", "redis://***@host:6379", "sekrit"),
        (
            "redis://host:6379/0?password=sekrit&db=1",
            "redis://host:6379/0?password=***&db=1",
            "sekrit",
        ),
        ("unix://:sekrit@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1", "sekrit"),
    ],
)
def test_passwords_with_url_delimiters_are_masked_whole(url, masked, secret):
    assert mask_url(url) == masked
    settings = resolve(url=url)
    assert secret not in repr(settings)
    assert settings.masked_url == masked


@pytest.mark.parametrize("password", ["p#ss", "pa/ss", "p?ss", "1234x", "p@ss:x"])
def test_a_url_that_cannot_be_parsed_is_reported_without_any_piece_of_its_password(password):
    url = f"redis://user:{password}@host:6379/0"
    try:
        resolve(url=url).pool()
    except ConfigurationError as error:
        message = str(error)
        assert password not in message
        assert "percent-encoded" in message
        for piece in filter(None, password.replace("#", " ").replace("/", " ").split()):
            assert f"'{piece}'" not in message
        assert error.__cause__ is None and error.__suppress_context__
    # some of these parse (the password then goes as written): nothing to report


def test_the_url_can_come_from_a_file_named_by_flag_or_environment(tmp_path):
    secret_file = tmp_path / "redis-url"
    secret_file.write_text("redis://worker:s3cret@cache:6390/2\n")
    by_flag = resolve(url_file=secret_file, env={"REDIS_URL": "redis://ignored:1"})
    by_env = resolve(env={"REDIS_URL_FILE": str(secret_file)})
    assert by_flag.url == by_env.url == "redis://worker:s3cret@cache:6390/2"
    assert "s3cret" not in by_flag.origin + by_env.origin + repr(by_flag)
    assert str(secret_file) in by_env.origin
    assert resolve_url(None, secret_file, env={}).url == by_flag.url
    assert resolve_url("redis://h:1", None, env={}).url == "redis://h:1"
    assert resolve_url(None, None, env={"REDIS_HOST": "h"}).url == "redis://h:6379"


@pytest.mark.parametrize(
    ("content", "expected"),
    [(None, "cannot read the Redis URL"), ("", "is empty"), ("a\nb", "several lines")],
)
def test_a_bad_url_file_is_one_line_naming_the_file_never_its_content(tmp_path, content, expected):
    path = tmp_path / "url"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigurationError, match=expected) as caught:
        resolve(url_file=path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_a_url_and_a_url_file_together_are_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="not both"):
        resolve(url="redis://:hunter2@h:1", url_file=tmp_path / "url")
    with pytest.raises(ConfigurationError, match="set only one"):
        resolve(env={"REDIS_URL": "redis://:hunter2@h", "REDIS_URL_FILE": str(tmp_path)})


def test_a_client_never_shows_a_password_with_delimiters(caplog):
    caplog.set_level(logging.DEBUG)
    client = EventClient("k", url="redis://me:p@ss:w@rd@127.0.0.1:1/0")  # parses: '@' is fine
    with pytest.raises(RedisUnavailable) as caught:
        client.append({"kind": "x"})
    shown = str(caught.value) + caplog.text + repr(client) + client.location
    assert "p@ss" not in shown and "w@rd" not in shown
    with pytest.raises(ConfigurationError) as refused:  # '/' and '#' cut the URL short
        EventClient("k", url="redis://me:p#ss/w@rd@127.0.0.1:1/0")
    assert "p#ss" not in str(refused.value) and "w@rd" not in str(refused.value)


def test_cli_flags_for_the_url_and_its_file_are_exclusive_and_feed_resolve_url(tmp_path, capsys):
    import argparse

    from rqse.connection import redis_arguments

    parser = argparse.ArgumentParser(prog="tool")
    redis_arguments(parser)
    path = tmp_path / "url"
    path.write_text("redis://:s3cret@db:6379/0")
    args = parser.parse_args(["--redis-url-file", str(path)])
    assert resolve_url(args.redis_url, args.redis_url_file, env={}).url.endswith("@db:6379/0")
    with pytest.raises(SystemExit):
        parser.parse_args(["--redis-url", "redis://h", "--redis-url-file", str(path)])
    assert "not allowed with argument" in capsys.readouterr().err
