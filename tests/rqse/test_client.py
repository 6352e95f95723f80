import pytest

from rqse import EventClient, RedisCommandError, message


@pytest.fixture
def client(redis_url, redis_client):
    with EventClient("events", url=redis_url) as client:
        yield client


def test_append_returns_the_entry_id_and_range_reads_it_back(client):
    entry_id = client.append(message({"n": 1}, kind="k"))
    [(read_id, event)] = client.range()
    assert read_id == entry_id
    assert event["n"] == 1 and event["kind"] == "k"


def test_read_and_range_follow_rqse_05_count_defaults(client):
    ids = client.append_many([{"kind": "k", "n": n} for n in range(5)])
    assert [i for i, _ in client.read()] == ids[:1]
    assert [i for i, _ in client.read(count=10, after=ids[1])] == ids[2:]
    assert [i for i, _ in client.range(ids[1], ids[3], count=None)] == ids[1:4]
    assert len(client) == client.len() == 5


def test_append_can_write_to_another_stream(client, redis_client):
    client.append({"kind": "k"}, key="elsewhere")
    assert redis_client.xlen("elsewhere") == 1
    assert len(client) == 0


def test_delete_and_delete_stream(client, redis_client):
    first, second = client.append_many([{"kind": "k"}, {"kind": "k"}])
    assert client.delete(first) == 1
    assert client.delete() == 0
    assert [i for i, _ in client.range(count=None)] == [second]
    assert client.delete_stream() == 1
    assert not redis_client.exists("events")


def test_append_with_an_explicit_maxlen_or_minid_trims(client):
    ids = [client.append({"kind": "k", "n": n}, maxlen=3, approximate=False) for n in range(6)]
    assert [i for i, _ in client.range(count=None)] == ids[-3:]
    client.append({"kind": "k"}, minid=ids[-1], approximate=False)
    assert client.range(count=None)[0][0] == ids[-1]
    assert client.trim(maxlen=1) == 1
    with pytest.raises(ValueError, match="exactly one"):
        client.trim()


def test_redis_errors_are_translated_and_name_the_key(client, redis_client):
    redis_client.set("events", "not a stream")
    with pytest.raises(RedisCommandError, match="XADD on 'events'") as caught:
        client.append({"kind": "k"})
    assert "WRONGTYPE" in str(caught.value)
    assert caught.value.__cause__ is not None


def test_a_shared_pool_is_used_as_given(redis_url, redis_client):
    import redis

    pool = redis.ConnectionPool.from_url(redis_url)
    client = EventClient("events", pool=pool)
    client.append({"kind": "k"})
    assert client.pool is pool
    client.close()  # not ours: stays usable
    assert len(client) == 1
    pool.disconnect()


def test_a_pool_that_decodes_responses_is_refused(redis_url):
    import redis

    from rqse import ConfigurationError

    with pytest.raises(ConfigurationError, match="decode_responses=False"):
        EventClient("events", pool=redis.ConnectionPool.from_url(redis_url, decode_responses=True))
