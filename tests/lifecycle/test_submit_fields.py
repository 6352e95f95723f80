"""start_workflows packs its XADDs itself: what it sends is what the event builder gives."""

from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from flowlang.limits import DEFAULT_LIMITS, LimitExceeded, Limits
from lifecycle.keys import Keys
from lifecycle.submit import encode_start, start_workflows

KEYS = Keys()
GRAPH = compile_text("A → B")


def _sent(client: redis.Redis) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in client.xrange(KEYS.lifecycle)]


@pytest.mark.parametrize(
    "options",
    [{}, {"priority": 3}, {"concurrency_key": "k", "max_running": 2}],
    ids=["plain", "priority", "concurrency"],
)
def test_start_workflows_sends_the_fields_of_encode_start_in_its_order(
    redis_client: redis.Redis, options: dict[str, Any]
) -> None:
    inputs = [{"n": n, "s": "é%$"} for n in range(5)]
    ids = [f"w{n}" for n in range(5)]
    start_workflows(redis_client, GRAPH, inputs, ids, KEYS, chunk=2, **options)
    sent = _sent(redis_client)
    for fields, workflow_id, value in zip(sent, ids, inputs, strict=True):
        expected = encode_start(workflow_id, GRAPH.content_hash(), value, DEFAULT_LIMITS, **options)
        salt = orjson.loads(fields[b"salt"])
        assert len(salt) == 32 and int(salt, 16) >= 0
        expected["salt"] = fields[b"salt"]
        assert list(fields.items()) == [(k.encode(), v) for k, v in expected.items()]
    assert len({fields[b"salt"] for fields in sent}) == len(sent)  # a secret each
    assert redis_client.get(KEYS.graph(GRAPH.content_hash())) == GRAPH.to_json()
    assert redis_client.smembers(KEYS.kinds) == {b"default"}


def test_an_input_past_the_limits_sends_nothing_of_the_submission(
    redis_client: redis.Redis,
) -> None:
    inputs: list[Any] = [{"n": n} for n in range(5)] + [{"big": "x" * 200}]
    with pytest.raises(LimitExceeded, match="the input of workflow w5"):
        start_workflows(
            redis_client,
            GRAPH,
            inputs,
            [f"w{n}" for n in range(6)],
            KEYS,
            chunk=2,
            limits=Limits(value_bytes=100),
        )
    assert redis_client.exists(KEYS.lifecycle, KEYS.graph(GRAPH.content_hash())) == 0
