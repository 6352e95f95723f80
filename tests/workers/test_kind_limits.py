"""Concurrency limits per task kind: at most N tasks run at once, across workers."""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle.cli.main import main
from lifecycle.kind_limits import BadKindLimit, list_kind_limits, set_kind_limit
from lifecycle.submit import start_workflow, terminate_workflow
from tests.conftest import wait_until
from tests.processes import Processes
from tests.workers.helpers import KEYS, Threads, submit, wait_for_end
from tests.workers.limited import HELD_STARTED
from workers import Task, TaskListener


class Recorder(TaskListener):
    """Records (start, end) of each run; waits for ``gate`` when one is given."""

    kind = "lim"
    slot_lease = 3.0
    slot_check_interval = 0.2

    def __init__(self, runs: list[tuple[str, float, float]], gate: Any = None, **options: Any):
        super().__init__(**options)
        self.runs = runs
        self.gate = gate

    def run(self, task: Task) -> Any:
        start = time.monotonic()
        if self.gate is not None:
            self.gate.wait(10)
        time.sleep(task.input.get("s", 0.0) if isinstance(task.input, dict) else 0.0)
        self.runs.append((task.workflow + "/" + task.key, start, time.monotonic()))
        return {"ok": True}


def assert_nothing_held(client: redis.Redis, kind: str = "lim") -> None:
    """No slot of ``kind`` held and nobody in its line."""
    assert client.zcard(KEYS.slots(kind)) == 0
    assert client.zcard(KEYS.slot_queue(kind)) == 0


def most_at_once(runs: list[tuple[str, float, float]]) -> int:
    moments = sorted([(s, 1) for _, s, _ in runs] + [(e, -1) for _, _, e in runs])
    running = most = 0
    for _, step in moments:
        running += step
        most = max(most, running)
    return most


def recorders(threads: Threads, count: int, runs: list, gate: Any = None) -> list[Recorder]:
    return [
        threads.start(Recorder(runs, gate, pool=threads.pool, handle_signals=False, block_ms=100))
        for _ in range(count)
    ]


def test_a_limit_of_two_never_runs_more_than_two_of_fifty_tasks_at_once(
    redis_client: redis.Redis, threads: Threads
) -> None:
    set_kind_limit(redis_client, KEYS, "lim", 2)
    runs: list[tuple[str, float, float]] = []
    threads.lifecycle()
    recorders(threads, 8, runs)
    items = orjson.dumps([{"s": 0.02, "n": n} for n in range(50)]).decode()
    workflow = submit(redis_client, f"<{items}> → * lim:work")
    assert wait_for_end(redis_client, workflow, timeout=30)["status"] == "finished"
    assert len({name for name, _, _ in runs}) == 50
    assert most_at_once(runs) == 2
    assert_nothing_held(redis_client)


def test_tasks_waiting_for_a_slot_start_in_the_order_they_were_sent(
    redis_client: redis.Redis, threads: Threads
) -> None:
    set_kind_limit(redis_client, KEYS, "lim", 1)
    runs: list[tuple[str, float, float]] = []
    threads.lifecycle()
    recorders(threads, 5, runs)
    first = submit(redis_client, "lim:work", {"s": 0.5})  # holds the slot while all queue
    wait_until(lambda: redis_client.zcard(KEYS.slots("lim")) == 1, what="the first to hold")
    later = [submit(redis_client, "lim:work", {"s": 0.0}) for _ in range(4)]
    for workflow in [first, *later]:
        assert wait_for_end(redis_client, workflow, timeout=20)["status"] == "finished"
    started = [name.split("/")[0] for name, _, _ in sorted(runs, key=lambda run: run[1])]
    assert started == [first, *later]


def test_a_limit_raised_or_removed_takes_effect_on_running_workers(
    redis_client: redis.Redis, threads: Threads, redis_url: str
) -> None:
    set_kind_limit(redis_client, KEYS, "lim", 1)
    runs: list[tuple[str, float, float]] = []
    gate = threading.Event()
    started: list[str] = []

    class Counting(Recorder):
        def run(self, task: Task) -> Any:
            started.append(task.workflow)
            return super().run(task)

    threads.lifecycle()
    for _ in range(5):
        threads.start(Counting(runs, gate, pool=threads.pool, handle_signals=False, block_ms=100))
    workflows = [submit(redis_client, "lim:work") for _ in range(5)]
    # The holder's run() may begin a moment after it took the slot: wait for both.
    wait_until(
        lambda: redis_client.zcard(KEYS.slot_queue("lim")) == 4 and len(started) == 1,
        what="1 to run and 4 to wait",
    )
    assert main(["limit", "set", "lim", "3", "--redis-url", redis_url]) == 0
    wait_until(lambda: len(started) == 3, timeout=5, what="3 to run")
    assert main(["limit", "remove", "lim", "--redis-url", redis_url]) == 0
    wait_until(lambda: len(started) == 5, timeout=5, what="all 5 to run")
    gate.set()
    for workflow in workflows:
        assert wait_for_end(redis_client, workflow)["status"] == "finished"


def test_a_task_terminated_while_waiting_for_a_slot_never_runs_nor_takes_one(
    redis_client: redis.Redis, threads: Threads
) -> None:
    set_kind_limit(redis_client, KEYS, "lim", 1)
    runs: list[tuple[str, float, float]] = []
    gate = threading.Event()
    threads.lifecycle()
    recorders(threads, 2, runs, gate)
    holder = submit(redis_client, "lim:work")
    wait_until(lambda: redis_client.zcard(KEYS.slots("lim")) == 1, what="a holder")
    waiting = submit(redis_client, "lim:work")
    wait_until(lambda: redis_client.zcard(KEYS.slot_queue("lim")) == 1, what="a waiter")
    terminate_workflow(redis_client, waiting)
    assert wait_for_end(redis_client, waiting)["status"] == "terminated"
    wait_until(lambda: redis_client.zcard(KEYS.slot_queue("lim")) == 0, what="it to leave")
    gate.set()
    assert wait_for_end(redis_client, holder)["status"] == "finished"
    assert [name.split("/")[0] for name, _, _ in runs] == [holder]
    assert redis_client.zcard(KEYS.slots("lim")) == 0
    assert redis_client.xpending(KEYS.tasks("lim"), "workers")["pending"] == 0


def test_a_worker_killed_holding_the_only_slot_frees_it_after_its_lease(
    redis_client: redis.Redis, threads: Threads, redis_url: str
) -> None:
    set_kind_limit(redis_client, KEYS, "held", 1)
    processes = Processes(redis_url)
    try:
        proc = processes.start(
            "workers", "run", "tests.workers.limited:Holder", "--consumer", "doomed"
        )
        threads.lifecycle()
        stuck = submit(redis_client, "held:work", {"seconds": 60})
        wait_until(lambda: redis_client.llen(HELD_STARTED) == 1, timeout=15, what="a holder")
        proc.kill()
        proc.wait()
        killed_at = time.monotonic()
        survivor = type(
            "Survivor", (TaskListener,), {"kind": "held", "run": lambda self, task: {"ok": 1}}
        )
        threads.start(survivor(pool=threads.pool, handle_signals=False, block_ms=100))
        fresh = submit(redis_client, "held:work", {"seconds": 0})
        assert wait_for_end(redis_client, fresh, timeout=10)["status"] == "finished"
        # Not before the dead holder's lease (1.5 s, renewed every 0.5 s) lapsed.
        assert time.monotonic() - killed_at > 0.9
        assert redis_client.zrange(KEYS.slots("held"), 0, -1) == []
        terminate_workflow(redis_client, stuck)
    finally:
        processes.stop_all()


def test_limit_list_shows_each_kind_with_its_slots_and_bad_values_are_one_line(
    redis_client: redis.Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = redis_url
    assert main(["limit", "set", "ml", "2", "--redis-url", url]) == 0
    assert main(["limit", "list", "--json", "--redis-url", url]) == 0
    out = capsys.readouterr().out
    assert orjson.loads(out.split("\n", 1)[1]) == [
        {"kind": "ml", "limit": 2, "running": 0, "waiting": 0}
    ]
    assert main(["limit", "set", "ml", "zero", "--redis-url", url]) == 2
    assert main(["limit", "set", "ml", "0", "--redis-url", url]) == 2
    assert main(["limit", "set", "a b", "1", "--redis-url", url]) == 2
    huge = "99999999999999999999999"  # refused before anything is written
    assert main(["limit", "set", "ml", huge, "--redis-url", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("error: limit set") for line in err)
    with pytest.raises(BadKindLimit):
        set_kind_limit(redis_client, KEYS, "ml:x", 1)
    assert [limit.limit for limit in list_kind_limits(redis_client, KEYS)] == [2]


def test_a_task_running_past_its_slot_lease_keeps_the_slot_by_renewing_it(
    redis_client: redis.Redis, threads: Threads
) -> None:
    set_kind_limit(redis_client, KEYS, "lim", 1)
    runs: list[tuple[str, float, float]] = []

    class ShortLease(Recorder):
        slot_lease = 0.6  # renewed every 0.2 s; each task runs 1.2 s

    threads.lifecycle()
    for _ in range(2):
        threads.start(ShortLease(runs, pool=threads.pool, handle_signals=False, block_ms=100))
    workflows = [submit(redis_client, "lim:work", {"s": 1.2}) for _ in range(2)]
    for workflow in workflows:
        assert wait_for_end(redis_client, workflow, timeout=15)["status"] == "finished"
    assert len(runs) == 2
    assert most_at_once(runs) == 1


def test_a_worker_whose_user_may_not_read_the_limits_says_so_once_and_runs_without(
    redis_client: redis.Redis, redis_url: str, threads: Threads, caplog: pytest.LogCaptureFixture
) -> None:
    # Every key the worker uses but the limits (ACL key patterns cannot exclude one).
    patterns = ["~{flow}:tasks:*", "~{flow}:lifecycle", "~{flow}:stopped", "~{flow}:wf:*"]
    patterns += ["~{flow}:priorities", "~{flow}:slot*"]
    redis_client.execute_command("ACL", "SETUSER", "blind", "on", ">pw", "+@all", *patterns)
    pool = redis.ConnectionPool.from_url(redis_url, username="blind", password="pw")
    try:
        set_kind_limit(redis_client, KEYS, "lim", 1)
        runs: list[tuple[str, float, float]] = []
        gate = threading.Event()
        threads.lifecycle()
        for _ in range(2):
            threads.start(Recorder(runs, gate, pool=pool, handle_signals=False, block_ms=100))
        workflows = [submit(redis_client, "lim:work") for _ in range(2)]
        wait_until(lambda: _pending(redis_client, "lim") == 2, what="both tasks taken")
        time.sleep(0.3)
        assert redis_client.zcard(KEYS.slot_queue("lim")) == 0  # nobody waits
        gate.set()
        for workflow in workflows:
            assert wait_for_end(redis_client, workflow)["status"] == "finished"
        assert most_at_once(runs) == 2
        refusals = [r for r in caplog.records if "runs without its limit" in r.getMessage()]
        assert len(refusals) == 2  # once per worker
    finally:
        threads.stop_all()
        pool.disconnect()
        redis_client.execute_command("ACL", "DELUSER", "blind")


def _pending(client: redis.Redis, kind: str) -> int:
    """Start-tasks of ``kind`` taken and not answered yet (0 before the group exists)."""
    try:
        return int(client.xpending(KEYS.tasks(kind), "workers")["pending"])
    except redis.ResponseError:
        return 0


def test_a_limit_counts_the_tasks_of_every_partition_together(
    redis_client: redis.Redis, threads: Threads
) -> None:
    from lifecycle.partitions import Partitions
    from lifecycle.worker import LifecycleWorker

    partitions = Partitions("{flow}", 3)
    set_kind_limit(redis_client, partitions.home, "lim", 2)
    runs: list[tuple[str, float, float]] = []
    for keys in partitions.all:
        threads.start(LifecycleWorker(keys, pool=threads.pool, handle_signals=False, block_ms=100))
        for _ in range(3):  # 9 threads in all, 3 on each partition's stream
            threads.start(
                Recorder(
                    runs,
                    keys=keys,
                    home_pool=threads.pool,
                    pool=threads.pool,
                    handle_signals=False,
                    block_ms=100,
                )
            )
    items = orjson.dumps([{"s": 0.05}] * 4).decode()
    graph = compile_text(f"<{items}> → * lim:work")
    ids = [f"w{n}" for n in range(6)]
    for workflow in ids:
        start_workflow(redis_client, graph, None, workflow, partitions.keys_for(workflow))
    assert len({partitions.index_of(w) for w in ids}) == 3
    wait_until(lambda: len(runs) == 24, timeout=30, what="all 24 tasks run")
    assert most_at_once(runs) == 2
    wait_until(lambda: redis_client.zcard(partitions.home.slots("lim")) == 0, what="slots freed")
