"""fastpipe: many commands per round trip, replies in order, errors as values."""

import redis

from rqse import fastpipe


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


def _url(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"
