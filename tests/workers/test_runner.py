"""Loading and building listener classes for `python -m workers run` (no processes)."""

from __future__ import annotations

import threading

import pytest
import redis

from examples.seed_worker import StockListener
from tests.rqse.seed_sleep_listener import SleepListener
from tests.workers.helpers import KEYS
from tests.workers.sample import Upper
from workers.errors import WorkerLoadError
from workers.runner import Runner, build_listener, load_listener_class


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "expected package.module:ClassName"),
        ("no.such.module:X", "cannot import 'no.such.module'"),
        ("tests.workers.sample:Missing", "has no 'Missing'"),
        ("tests.workers.sample:NotAListener", "expected a subclass of rqse.EventListener"),
        ("../mine/worker.py:Team", "is a file path; give the module's dotted name"),
    ],
)
def test_a_target_that_is_not_a_listener_class_is_refused_with_one_line(
    spec: str, message: str
) -> None:
    with pytest.raises(WorkerLoadError) as caught:
        load_listener_class(spec)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_task_listener_is_built_with_its_kind_and_consumer(redis_client: redis.Redis) -> None:
    pool = redis_client.connection_pool
    upper = build_listener(Upper, keys=KEYS, pool=pool, consumer="up-1")
    assert upper.streams == (KEYS.tasks("text"),) and upper.consumer == "up-1"
    other = build_listener(Upper, keys=KEYS, pool=pool, kind="loud")
    assert other.streams == (KEYS.tasks("loud"),) and other.group == "workers"


def test_a_seed_style_listener_gets_the_stream_of_the_kind_it_is_told(
    redis_client: redis.Redis,
) -> None:
    pool = redis_client.connection_pool
    with pytest.raises(WorkerLoadError, match="give the task kind it serves with --kind"):
        build_listener(SleepListener, keys=KEYS, pool=pool)
    with pytest.raises(WorkerLoadError, match="takes no consumer= argument"):
        build_listener(SleepListener, keys=KEYS, pool=pool, kind="sleep", consumer="s")
    seed = build_listener(SleepListener, keys=KEYS, pool=pool, kind="sleep")
    assert seed.streams == (KEYS.tasks("sleep"),) and seed.group == "workers"
    stock = build_listener(StockListener, keys=KEYS, pool=pool, consumer="stock-0")
    assert stock.streams == (KEYS.tasks("stock"),) and stock.consumer == "stock-0"


def test_a_runner_stopped_from_another_thread_drains_and_returns_zero(
    redis_client: redis.Redis,
) -> None:
    pool = redis_client.connection_pool
    listeners = [
        build_listener(Upper, keys=KEYS, pool=pool, consumer=f"up-{n}", options={"block_ms": 50})
        for n in range(3)
    ]
    runner = Runner(listeners, drain_timeout=5)
    threading.Timer(0.3, runner.stop).start()
    assert runner.run(install_signals=False) == 0
    assert not any(listener.running for listener in listeners)
