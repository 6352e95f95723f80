import redis


def test_fixture_gives_a_real_server_that_speaks_streams(redis_client: redis.Redis) -> None:
    entry_id = redis_client.xadd("smoke", {"kind": '"ping"'})
    assert redis_client.xlen("smoke") == 1
    assert redis_client.xrange("smoke")[0][0] == entry_id
    info = redis_client.info("server")
    assert info.get("redis_version") or info.get("valkey_version")


def test_each_test_starts_with_an_empty_database(redis_client: redis.Redis) -> None:
    assert redis_client.dbsize() == 0
    redis_client.set("left-behind", 1)
