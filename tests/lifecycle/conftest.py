import pytest
import redis

from tests.lifecycle.harness import Harness


@pytest.fixture
def harness(redis_client: redis.Redis) -> Harness:
    return Harness(redis_client)
