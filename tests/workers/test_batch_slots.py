"""A batch's tasks take their kind's slots in one call and release them in one."""

from __future__ import annotations

import time

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle.kind_limits import KindSlots, entry_order, list_kind_limits, set_kind_limit
from lifecycle.stored_state import state_from_fields
from lifecycle.submit import start_workflow
from rqse import BatchWeather
from rqse.server import RedisServer, free_port
from rqse.weather import OUT_OF_MEMORY, classify
from tests.conftest import wait_until
from tests.workers.helpers import KEYS, Threads, state, submit, wait_for_end
from tests.workers.test_kind_limits import Recorder, assert_nothing_held, most_at_once
from workers.noop import NoopWorker
from workers.slots import BatchSlots


def slots_of(client: redis.Redis, kind: str = "lim", lease: float = 30.0) -> KindSlots:
    return KindSlots(client, KEYS, kind, "tester", lease=lease)


def limited_to(client: redis.Redis, limit: int) -> KindSlots:
    """Kind ``lim`` limited to ``limit``, and a holder's side of its slots."""
    set_kind_limit(client, KEYS, "lim", limit)
    return slots_of(client)


def ids(*entry_ids: str) -> list[bytes]:
    return [entry_id.encode() for entry_id in entry_ids]


def test_a_batch_takes_a_slot_for_each_task_that_has_room_and_lines_up_the_rest(
    redis_client: redis.Redis,
) -> None:
    slots = limited_to(redis_client, 3)
    batch = ids(*[f"1732600000000-{n}" for n in range(5)])
    assert slots.take(batch) == [1, 1, 1, 0, 0]
    assert redis_client.zcard(KEYS.slots("lim")) == 3
    # The first to wait and the later ones join the line when their turn comes.
    assert redis_client.zcard(KEYS.slot_queue("lim")) == 0
    slots.release([slots.member(i.decode()) for i in batch[:3]])
    assert redis_client.zcard(KEYS.slots("lim")) == 0


def test_a_task_waiting_ahead_in_line_keeps_its_place_against_a_whole_batch(
    redis_client: redis.Redis,
) -> None:
    slots = limited_to(redis_client, 1)
    other = KindSlots(redis_client, KEYS, "lim", "other")
    holder, early = other.member("1732600000000-1"), other.member("1732600000000-2")
    assert other.call("acquire", holder, entry_order("1732600000000-1"))[0] == 1
    assert other.call("acquire", early, entry_order("1732600000000-2"))[0] == 0  # in line
    other.release([holder])
    assert slots.take(ids("1732600000000-3")) == [0]
    assert redis_client.zrange(KEYS.slot_queue("lim"), 0, -1) == [early.encode()]
    assert other.call("acquire", early, entry_order("1732600000000-2"))[0] == 1


def test_a_batch_with_room_and_nobody_waiting_holds_its_slots_under_one_member(
    redis_client: redis.Redis,
) -> None:
    slots = limited_to(redis_client, 10)
    assert slots.take(ids(*[f"5-{n}" for n in range(6)])) == slots.member("5-0")
    assert redis_client.zrange(KEYS.slots("lim"), 0, -1) == [slots.member("5-0").encode()]
    assert list_kind_limits(redis_client, KEYS)[0].running == 6
    # 4 left: a second batch of 5 gets each task's own slot or a place in line.
    assert slots.take(ids(*[f"6-{n}" for n in range(5)])) == [1, 1, 1, 1, 0]
    assert list_kind_limits(redis_client, KEYS)[0].running == 10
    slots.give(slots.member("5-0"), 2)
    assert list_kind_limits(redis_client, KEYS)[0].running == 8
    slots.release([slots.member("5-0")])
    assert list_kind_limits(redis_client, KEYS)[0].running == 4
    assert redis_client.exists(KEYS.slot_batches("lim")) == 0


def test_a_batch_taken_again_by_its_holder_holds_its_slots_once(
    redis_client: redis.Redis,
) -> None:
    slots = limited_to(redis_client, 3)
    assert slots.take(ids("5-0", "5-1", "5-2")) == slots.member("5-0")
    assert slots.take(ids("5-0", "5-1", "5-2")) == slots.member("5-0")  # redelivered to it
    assert list_kind_limits(redis_client, KEYS)[0].running == 3


def test_a_batch_holder_whose_lease_lapsed_frees_every_slot_it_held(
    redis_client: redis.Redis,
) -> None:
    set_kind_limit(redis_client, KEYS, "lim", 4)
    dead = slots_of(redis_client, lease=0.2)
    assert dead.take(ids("5-0", "5-1", "5-2", "5-3")) == dead.member("5-0")
    dead.renewer.drop([dead.member("5-0")])  # its process died: nobody renews it
    alive = KindSlots(redis_client, KEYS, "lim", "alive")
    assert alive.take(ids("6-0")) == [0]
    wait_until(
        lambda: alive.take(ids("6-0")) == alive.member("6-0"), what="the lapsed batch's slots"
    )
    assert list_kind_limits(redis_client, KEYS)[0].running == 1
    assert redis_client.exists(KEYS.slot_batches("lim")) == 0


def test_a_kind_without_a_limit_takes_nothing(redis_client: redis.Redis) -> None:
    slots = slots_of(redis_client)
    assert slots.take(ids("5-0")) is None
    assert redis_client.exists(KEYS.slots("lim"), KEYS.slot_queue("lim")) == 0


def test_a_batch_of_thousands_is_taken_and_released_in_one_call_each(
    redis_client: redis.Redis,
) -> None:
    slots = limited_to(redis_client, 2500)
    whole = ids(*[f"7-{n}" for n in range(2000)])
    assert slots.take(whole) == slots.member("7-0")
    each = slots.take(ids(*[f"8-{n}" for n in range(1500)]))  # 500 left
    assert each == [1] * 500 + [0] * 1000
    assert list_kind_limits(redis_client, KEYS)[0].running == 2500
    slots.release([slots.member("7-0"), *[slots.member(f"8-{n}") for n in range(500)]])
    assert list_kind_limits(redis_client, KEYS)[0].running == 0


def test_tasks_of_one_millisecond_past_the_thousandth_keep_stream_order(
    redis_client: redis.Redis,
) -> None:
    slots = limited_to(redis_client, 1)
    # The batch's first gets the slot, not the one whose name sorts first as text.
    assert slots.take(ids("9-999", "9-1000", "9-1001")) == [1, 0, 0]
    assert redis_client.zrange(KEYS.slots("lim"), 0, -1) == [slots.member("9-999").encode()]
    assert slots.renewer._held == {slots.member("9-999")}  # what is held is what is renewed
    # The later ones wait in stream order, whichever asks first.
    for entry_id in ("9-1001", "9-1000"):
        assert slots.call("acquire", slots.member(entry_id), entry_order(entry_id))[0] == 0
    line = redis_client.zrange(KEYS.slot_queue("lim"), 0, -1)
    assert line == [slots.member("9-1000").encode(), slots.member("9-1001").encode()]
    slots.release([slots.member("9-999")])
    assert slots.call("acquire", slots.member("9-1001"), entry_order("9-1001"))[0] == 0
    assert slots.call("acquire", slots.member("9-1000"), entry_order("9-1000"))[0] == 1


def test_a_slot_freed_while_a_batch_runs_goes_to_the_next_in_line_not_to_its_later_tasks(
    redis_client: redis.Redis,
) -> None:
    set_kind_limit(redis_client, KEYS, "lim", 2)
    other = KindSlots(redis_client, KEYS, "lim", "other")
    assert other.call("acquire", other.member("4-0"), 4)[0] == 1
    batch = BatchSlots(slots_of(redis_client))
    assert batch.take(ids("5-0", "5-1"))  # 5-0 holds a slot, 5-1 must wait: not in line yet
    assert redis_client.zcard(KEYS.slot_queue("lim")) == 0
    other.release([other.member("4-0")])
    later = KindSlots(redis_client, KEYS, "lim", "later")
    assert later.call("acquire", later.member("6-0"), 6)[0] == 1  # not kept for 5-1


def test_a_batch_cut_short_leaves_no_slot_held_and_no_place_in_line(
    redis_client: redis.Redis,
) -> None:
    slots = limited_to(redis_client, 1)
    other = KindSlots(redis_client, KEYS, "lim", "other")
    assert other.call("acquire", other.member("4-0"), 4)[0] == 1
    # 5-1 waited in line before (a redelivery): the batch finds it there.
    assert slots.call("acquire", slots.member("5-1"), 5)[0] == 0
    batch = BatchSlots(slots)
    assert batch.take(ids("5-0", "5-1"))
    assert batch.finish() is None  # a stop before either ran
    assert redis_client.zcard(KEYS.slot_queue("lim")) == 0
    assert redis_client.zcard(KEYS.slot_waiting("lim")) == 0
    assert redis_client.zrange(KEYS.slots("lim"), 0, -1) == [other.member("4-0").encode()]


def test_a_slot_taken_for_an_entry_never_run_does_not_hold_back_the_batchs_next_task(
    redis_client: redis.Redis,
) -> None:
    slots = limited_to(redis_client, 1)
    batch = BatchSlots(slots)
    assert batch.take(ids("5-0", "5-1"))  # 5-0 holds the slot; it is dead-lettered unread
    assert batch.hold("5-1", lambda: "it waited") == slots.member("5-1")
    assert slots.renewer._held == {slots.member("5-1")}
    batch.ran(slots.member("5-1"))
    assert batch.finish() is not None


def test_a_whole_batch_whose_every_task_failed_holds_nothing_and_is_not_renewed(
    redis_client: redis.Redis,
) -> None:
    slots = limited_to(redis_client, 5)
    batch = BatchSlots(slots)
    assert batch.take(ids("5-0", "5-1"))
    for entry_id in ("5-0", "5-1"):
        slot = batch.hold(entry_id, lambda: None)
        assert slot == slots.member("5-0")
        batch.failed(slot)
    assert list_kind_limits(redis_client, KEYS)[0].running == 0
    assert slots.member("5-0") not in slots.renewer._held
    assert batch.finish() is None


class Batched(Recorder):
    """Reads ten tasks at a time, with a lease far longer than the test may take."""

    slot_lease = 60.0


def test_a_batch_under_a_limit_of_one_runs_its_tasks_in_turn_not_waiting_for_its_own_answers(
    redis_client: redis.Redis, threads: Threads
) -> None:
    set_kind_limit(redis_client, KEYS, "lim", 1)
    runs: list[tuple[str, float, float]] = []
    threads.lifecycle()
    threads.start(
        Batched(runs, pool=threads.pool, handle_signals=False, block_ms=100, batch_size=10)
    )
    items = orjson.dumps([{"s": 0.01, "n": n} for n in range(10)]).decode()
    workflow = submit(redis_client, f"<{items}> → * lim:work")
    # A task waiting on the batch's own unsent release would wait out the 60 s lease.
    assert wait_for_end(redis_client, workflow, timeout=15)["status"] == "finished"
    assert len(runs) == 10
    assert most_at_once(runs) == 1
    assert_nothing_held(redis_client)


def test_a_noop_worker_answers_a_limited_kinds_tasks_only_once_they_hold_slots(
    redis_client: redis.Redis, threads: Threads
) -> None:
    set_kind_limit(redis_client, KEYS, "lim", 1)
    outside = slots_of(redis_client)
    assert outside.call("acquire", "outside", 1)[0] == 1  # the only slot, held elsewhere
    threads.lifecycle()
    threads.start(NoopWorker(["lim"], KEYS, pool=threads.pool, handle_signals=False, block_ms=100))
    workflows = [submit(redis_client, "lim:work", {"n": n}) for n in range(5)]
    # The first waits in line; the others join it when their turn comes.
    wait_until(lambda: redis_client.zcard(KEYS.slot_queue("lim")) == 1, what="1 in line")
    time.sleep(0.3)
    assert all(state(redis_client, w).get("status") == "running" for w in workflows)
    outside.release(["outside"])
    for workflow in workflows:
        assert wait_for_end(redis_client, workflow)["status"] == "finished"
    assert_nothing_held(redis_client)


def test_noop_workers_finish_every_task_of_a_limited_kind_and_leave_no_slot(
    redis_client: redis.Redis, threads: Threads
) -> None:
    set_kind_limit(redis_client, KEYS, "lim", 2)
    threads.lifecycle()
    for _ in range(2):
        threads.start(
            NoopWorker(["lim"], KEYS, pool=threads.pool, handle_signals=False, block_ms=100)
        )
    items = orjson.dumps(list(range(300))).decode()
    workflow = submit(redis_client, f"<{items}> → * lim:work")
    assert wait_for_end(redis_client, workflow, timeout=30)["status"] == "finished"
    assert_nothing_held(redis_client)
    assert redis_client.xpending(KEYS.tasks("lim"), "workers")["pending"] == 0


def test_noop_workers_of_every_partition_share_their_kinds_limit_at_home(
    redis_client: redis.Redis, threads: Threads
) -> None:
    from lifecycle.partitions import Partitions
    from lifecycle.worker import LifecycleWorker

    partitions = Partitions("{flow}", 3)
    set_kind_limit(redis_client, partitions.home, "lim", 1)
    outside = KindSlots(redis_client, partitions.home, "lim", "tester")
    assert outside.call("acquire", "outside", 1)[0] == 1  # the only slot, held elsewhere
    for keys in partitions.all:
        threads.start(LifecycleWorker(keys, pool=threads.pool, handle_signals=False, block_ms=100))
        threads.start(
            NoopWorker(
                ["lim"], keys, threads.pool, pool=threads.pool, handle_signals=False, block_ms=100
            )
        )
    graph = compile_text("lim:work")
    workflows = [f"w{n}" for n in range(6)]
    for workflow in workflows:
        start_workflow(redis_client, graph, None, workflow, partitions.keys_for(workflow))
    assert len({partitions.index_of(w) for w in workflows}) == 3
    home_line = partitions.home.slot_queue("lim")
    # One task of each partition's worker waits in the home line, the next behind it.
    wait_until(lambda: redis_client.zcard(home_line) == 3, what="3 in the home line")
    outside.release(["outside"])

    def status(workflow: str) -> str | None:
        fields = redis_client.hgetall(partitions.keys_for(workflow).workflow(workflow))
        return state_from_fields(fields).status if fields else None  # type: ignore[arg-type]

    wait_until(lambda: all(status(w) == "finished" for w in workflows), what="all 6 to finish")
    assert redis_client.zcard(partitions.home.slots("lim")) == 0


def test_weather_met_waiting_for_a_slot_is_batch_weather_not_the_task_s_failure() -> None:
    """The slots may live on another server than the task's stream: a listener asked
    only its own would count the delivery against the task."""
    with RedisServer() as server:
        client = redis.Redis(port=server.port)
        slots = BatchSlots(limited_to(client, 1))
        assert slots.take(ids("7-1", "7-2"))  # 7-2 waits for 7-1's slot
        assert slots.hold("7-1", lambda: None) == slots.slots.member("7-1")
        client.config_set("maxmemory", 1)
        with pytest.raises(BatchWeather) as raised:
            slots.hold("7-2", lambda: None)
        assert classify(raised.value) == OUT_OF_MEMORY
        assert "kind lim" in str(raised.value)
        client.close()


def test_a_whole_batch_s_slot_not_given_back_for_weather_is_left_to_its_release() -> None:
    with RedisServer() as server:
        client = redis.Redis(port=server.port)
        slots = BatchSlots(limited_to(client, 10))
        assert slots.take(ids("8-1", "8-2"))
        whole = slots.hold("8-1", lambda: None)
        client.replicaof("127.0.0.1", free_port())  # a replica refuses writes
        assert whole is not None
        slots.failed(whole)  # refused: logged, not raised over the task's own error
        client.replicaof("NO", "ONE")
        assert list_kind_limits(client, KEYS)[0].running == 2
        release = slots.finish()
        assert release is not None
        client.execute_command(*release)
        assert list_kind_limits(client, KEYS)[0].running == 0
        client.close()
