"""fastpipe: many commands per round trip, replies in order, errors as values."""

import time

import hiredis
import pytest
import redis

from rqse import fastpipe
from rqse.fastpipe import SLOT, Template


def test_replies_come_back_in_order_with_errors_in_place_and_the_connection_stays_usable(
    redis_client: redis.Redis,
) -> None:
    replies = fastpipe.execute(
        redis_client,
        [
            ("SET", "a", "1"),
            ("INCR", "a"),
            ("HSET", "a", "f", "v"),  # wrong type: an error reply, not an exception
            ("EVALSHA", "0" * 40, 0),
            ("GET", "a"),
        ],
    )
    assert replies[:2] == [b"OK", 2]
    assert isinstance(replies[2], redis.ResponseError) and "WRONGTYPE" in str(replies[2])
    assert isinstance(replies[3], redis.exceptions.NoScriptError)
    assert replies[4] == b"2"
    # redis-py's own commands on the same pooled connection read their own replies
    assert redis_client.incr("a") == 3 and redis_client.get("a") == b"3"


def test_replies_larger_than_one_socket_read_are_reassembled(redis_client: redis.Redis) -> None:
    value = b"x" * 300_000
    count = 40
    assert (
        fastpipe.execute(redis_client, [("SET", f"k{i}", value) for i in range(count)])
        == [b"OK"] * count
    )
    replies = fastpipe.execute(redis_client, [("GET", f"k{i}") for i in range(count)])
    assert replies == [value] * count
    assert redis_client.strlen("k0") == len(value)


def test_a_transaction_in_a_session_sees_its_watch(redis_client: redis.Redis) -> None:
    other = redis.Redis(connection_pool=redis.ConnectionPool.from_url(_url(redis_client)))
    with fastpipe.session(redis_client) as send:
        assert send([("WATCH", "w"), ("GET", "w")]) == [b"OK", None]
        other.set("w", "changed")
        replies = send([("MULTI",), ("SET", "w", "mine"), ("EXEC",)])
    assert replies[-1] is None  # the watched key changed: nothing written
    assert redis_client.get("w") == b"changed"
    with fastpipe.session(redis_client) as send:
        send([("WATCH", "w")])
        replies = send([("MULTI",), ("SET", "w", "mine"), ("INCR", "w"), ("EXEC",)])
    assert replies[-1][0] == b"OK" and isinstance(replies[-1][1], redis.ResponseError)
    assert redis_client.get("w") == b"mine"


def test_a_session_never_reconnects_behind_its_watch(redis_client: redis.Redis) -> None:
    """A health check (or a retry) would replace a dropped connection silently and the
    transaction would run without its WATCH: the session raises instead."""
    kwargs = redis_client.connection_pool.connection_kwargs
    watched = redis.Redis(host=kwargs["host"], port=kwargs["port"], health_check_interval=1)
    redis_client.set("w", "0")
    try:
        with fastpipe.session(watched) as send:
            assert send([("CLIENT", "ID"), ("WATCH", "w")])[1] == b"OK"
            redis_client.set("w", "changed by another")
            for client in redis_client.client_list():
                if client["cmd"] == "watch":
                    redis_client.client_kill_filter(_id=client["id"])
            time.sleep(1.1)  # a health check is due
            send([("MULTI",), ("SET", "w", "stale"), ("EXEC",)])
        raise AssertionError("the session went on without its WATCH")
    except redis.ConnectionError:
        pass
    assert redis_client.get("w") == b"changed by another"
    assert watched.ping()  # the pool recovers for the next user


def test_push_frames_of_resp3_do_not_shift_the_replies(redis_client: redis.Redis) -> None:
    tracked = redis.Redis.from_url(_url(redis_client) + "?protocol=3")
    redis_client.set("a", "1")
    redis_client.set("b", "2")
    with fastpipe.session(tracked) as send:
        send([("CLIENT", "TRACKING", "ON"), ("GET", "a")])  # "a" tracked on this connection
    redis_client.set("a", "changed")  # the server pushes an invalidation there
    assert fastpipe.execute(tracked, [("GET", "a"), ("GET", "b")]) == [b"changed", b"2"]
    assert fastpipe.execute(tracked, [("GET", "b")]) == [b"2"]


@pytest.mark.parametrize("protocol", [2, 3])
def test_replies_are_read_by_fastpipe_itself_under_both_protocols(
    redis_client: redis.Redis, protocol: int
) -> None:
    """The fast path must stay on with the redis-py in use (its default protocol became
    RESP3, which once sent every reply through read_response() unnoticed)."""
    client = redis.Redis.from_url(f"{_url(redis_client)}?protocol={protocol}")
    client.ping()
    connection = client.connection_pool.get_connection()
    client.connection_pool.release(connection)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("read_response() used")

    connection.read_response = refuse  # type: ignore[method-assign]
    replies = fastpipe.execute(
        client, [("SET", "k", "v"), ("GET", "k"), ("EXISTS", "none"), ("INCR", "k")]
    )
    assert replies[:3] == [b"OK", b"v", 0]
    assert isinstance(replies[3], redis.ResponseError)


def _url(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"


def test_a_transaction_returns_none_when_its_watch_fired_and_raises_on_an_error(
    redis_client: redis.Redis,
) -> None:
    with fastpipe.session(redis_client) as send:
        send([("WATCH", "t")])
        redis_client.set("t", "other")
        assert fastpipe.transaction(send, [("SET", "t", "mine")]) is None
    assert redis_client.get("t") == b"other"
    with fastpipe.session(redis_client) as send:
        assert fastpipe.transaction(send, [("SET", "t", "1"), ("INCR", "t")]) == [b"OK", 2]
    try:
        fastpipe.execute_transaction(redis_client, [("SET", "t", "x"), ("INCR", "t")])
        raise AssertionError("an error inside EXEC must raise")
    except redis.ResponseError as error:
        assert "not an integer" in str(error)


@pytest.mark.parametrize("slots", [0, 1, 3, 6])
def test_a_filled_template_packs_as_hiredis_packs_the_same_arguments(slots: int) -> None:
    # Values that a format could mistake for its own: % signs, CRLF, empty, long.
    values = [b"%d%b%%", b"a\r\nb", b"", b"x" * 70_000, b'{"n":1}', b"%"][:slots]
    arguments = ["XADD", "s%s", "*", *[a for n in range(slots) for a in (f"f{n}", SLOT)]]
    template = Template(*arguments)
    assert template.fill(*values) == hiredis.pack_command(tuple(template.unpacked(*values)))
    with pytest.raises(TypeError):
        template.fill(*values, b"one too many")
