"""The no-op worker's pass-through refuses an entry past max_entry_bytes as decoding would."""

import orjson
import redis

from lifecycle.keys import Keys
from rqse.keys import dead_letter_key
from workers.noop import NoopWorker

KEYS = Keys()


def _fields(workflow: str) -> dict[bytes, bytes]:
    event = {
        "kind": "start-task",
        "workflow": workflow,
        "name": "A",
        "index": 1,
        "key": "1",
        "attempt": 1,
        "id": f"{workflow}/1/1",
        "token": "0123456789abcdef",  # an engine start-task: the pass-through path
        "input": {"n": 1},
        "parameters": {},
    }
    return {name.encode(): orjson.dumps(value) for name, value in event.items()}


def test_a_start_task_one_byte_past_max_entry_bytes_is_dead_lettered_and_one_at_it_answered(
    redis_client: redis.Redis,
) -> None:
    at_limit, past_it = _fields("w1"), _fields("w22")
    limit = sum(map(len, at_limit)) + sum(map(len, at_limit.values()))
    stream = KEYS.tasks("default")
    redis_client.xadd(stream, at_limit)  # type: ignore[arg-type]
    redis_client.xadd(stream, past_it)  # type: ignore[arg-type]
    worker = NoopWorker(
        ["default"],
        pool=redis_client.connection_pool,
        handle_signals=False,
        block_ms=50,
        max_entry_bytes=limit,
    )
    assert worker.listen(max_events=2, idle_timeout=2.0) == 2
    ends = [orjson.loads(fields[b"workflow"]) for _, fields in redis_client.xrange(KEYS.lifecycle)]
    assert ends == ["w1"]
    dead = redis_client.xrange(dead_letter_key(stream))
    assert [orjson.loads(fields[b"reason"]) for _, fields in dead] == ["oversize"]
