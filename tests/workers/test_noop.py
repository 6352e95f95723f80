"""The no-op worker: echoes engine start-tasks without decoding them, survives garbage."""

import threading

import orjson
import redis

from lifecycle.events import end_task
from lifecycle.keys import Keys
from rqse.keys import dead_letter_key
from tests.conftest import wait_until
from workers.noop import NoopWorker, SimulatedWorker

KEYS = Keys()


def _start_task(workflow: str, key: str, input: object = None, **extra: object) -> dict:
    event = {
        "kind": "start-task",
        "workflow": workflow,
        "name": "A",
        "index": int(key.split(".")[0]),
        "key": key,
        "attempt": 2,
        "id": f"{workflow}/{key}/2",
        "input": input,
        "parameters": {},
        **extra,
    }
    return event


def _add(client: redis.Redis, fields: dict) -> None:
    client.xadd(KEYS.tasks("default"), fields)


def _encoded(event: dict) -> dict:
    return {name: orjson.dumps(value) for name, value in event.items()}


def _ends(client: redis.Redis) -> list[dict]:
    return [
        {k.decode(): orjson.loads(v) for k, v in fields.items()}
        for _, fields in client.xrange(KEYS.lifecycle)
    ]


def _options(client: redis.Redis) -> dict:
    return {"pool": client.connection_pool, "handle_signals": False, "block_ms": 50}


def _run(worker: NoopWorker, events: int) -> None:
    assert worker.listen(max_events=events, idle_timeout=2.0) == events


def test_an_engine_start_task_is_answered_as_end_task_would_answer_it(
    redis_client: redis.Redis,
) -> None:
    starts = [
        _start_task("w1", "3", {"n": 1, "text": "café"}),
        _start_task("w2", "4.0.1", None),  # no input: output {} as end_task() gives
        _start_task("w3", "5", [1, 2.5, None]),
    ]
    for start in starts:
        _add(redis_client, _encoded(start))
    worker = NoopWorker(
        ["default"], pool=redis_client.connection_pool, handle_signals=False, block_ms=50
    )
    _run(worker, 3)
    expected = [end_task(s, s["input"], worker=worker.consumer) for s in starts]
    assert _ends(redis_client) == expected


def test_garbage_is_dead_lettered_and_the_next_task_still_answered(
    redis_client: redis.Redis,
) -> None:
    good = _start_task("w1", "1", {"n": 1})
    bad_input = {**_encoded(_start_task("w2", "1")), "input": b"{not json"}
    smuggled = {**_encoded(_start_task("w3", "1")), "key": b'"1","x"'}  # two values in one
    _add(redis_client, bad_input)
    _add(redis_client, smuggled)
    _add(redis_client, {"kind": b'"start-task"'})  # nothing else
    _add(redis_client, _encoded(good))
    worker = NoopWorker(
        ["default"], pool=redis_client.connection_pool, handle_signals=False, block_ms=50
    )
    _run(worker, 4)
    assert [e["workflow"] for e in _ends(redis_client)] == ["w1"]
    dead = redis_client.xrange(dead_letter_key(KEYS.tasks("default")))
    reasons = [orjson.loads(fields[b"reason"]) for _, fields in dead]
    assert reasons == ["invalid-json", "invalid-json", "rejected"]


def test_a_seed_style_start_task_takes_the_decoding_path(redis_client: redis.Redis) -> None:
    seed = {"kind": "start-task", "workflow": "w9", "name": "A", "index": 2, "input": {"x": 1}}
    _add(redis_client, _encoded(seed))
    worker = NoopWorker(
        ["default"], pool=redis_client.connection_pool, handle_signals=False, block_ms=50
    )
    _run(worker, 1)
    (end,) = _ends(redis_client)
    assert (end["workflow"], end["key"], end["output"]) == ("w9", "2", {"x": 1})


def test_a_subclass_that_handles_tasks_itself_gets_decoded_events(
    redis_client: redis.Redis,
) -> None:
    seen: list[dict] = []

    class Recording(NoopWorker):
        def process(self, event_id: str, event: dict) -> bool:
            seen.append(event)
            return super().process(event_id, event)

    # With its token: an entry the no-op worker itself would pass through undecoded.
    start = _start_task("w1", "1", {"n": 1}, token="0123456789abcdef")
    _add(redis_client, _encoded(start))
    _run(Recording(["default"], **_options(redis_client)), 1)
    assert seen == [start]
    assert _ends(redis_client)[0]["output"] == {"n": 1}


def test_the_simulated_worker_still_decodes_to_build_its_output(
    redis_client: redis.Redis,
) -> None:
    _add(redis_client, _encoded(_start_task("w1", "1", {"done": ["Z"]})))
    worker = SimulatedWorker(
        ["default"],
        pool=redis_client.connection_pool,
        delay_max=0,
        handle_signals=False,
        block_ms=50,
    )
    _run(worker, 1)
    (end,) = _ends(redis_client)
    assert end["output"] == {"done": ["Z", "A"]}


def test_a_task_interrupted_by_a_stop_on_its_last_delivery_is_not_dead_lettered(
    redis_client: redis.Redis,
) -> None:
    """A stop is the worker's doing, not the task's: its delivery is given back, and
    the next worker answers it."""
    _add(redis_client, _encoded(_start_task("w1", "1", {"done": []})))
    stream = KEYS.tasks("default")
    options = {**_options(redis_client), "max_deliveries": 1, "claim_idle": 0.2}
    slow = SimulatedWorker(["default"], delay_max=30, consumer="slow", **options)
    slow.random.uniform = lambda low, high: high  # the longest task, and no failure
    worker = threading.Thread(target=slow.listen)
    worker.start()
    try:
        wait_until(lambda: slow.stats.received == 1, what="the task taken")
    finally:
        slow.stop()
        worker.join(10)
    assert not worker.is_alive()
    assert redis_client.xlen(dead_letter_key(stream)) == 0, "dead-lettered at a stop"
    [pending] = redis_client.xpending_range(stream, "workers", "-", "+", 1)
    assert pending["times_delivered"] == 0
    _run(SimulatedWorker(["default"], delay_max=0, consumer="next", **options), 1)
    (end,) = _ends(redis_client)
    assert end["output"] == {"done": ["A"]}
