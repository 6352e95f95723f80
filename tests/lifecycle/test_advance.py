"""The atomic advance against a real Redis, driven step by step."""

from typing import Any

import orjson

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall, run
from lifecycle.engine.advance import Advancer
from lifecycle.engine.store import load_workflow
from lifecycle.keys import Keys
from tests.lifecycle.harness import Harness, decode


def echo(call: TaskCall) -> Any:
    return {call.name: call.input}


def test_a_chain_runs_to_the_end_and_records_every_task(harness: Harness) -> None:
    record = harness.run(compile_text("A → B → C"), echo, {"x": 1})
    assert record.status == "finished"
    assert record.output == {"C": {"B": {"A": {"x": 1}}}}
    assert sorted(record.starts) == ["1", "2", "3"] and sorted(record.ends) == ["1", "2", "3"]


def test_joins_subflows_iteration_and_guards_give_the_runner_output(harness: Harness) -> None:
    text = "A → * { B → ? `$.B` C } → :x D; E → :x"

    def task(call: TaskCall) -> Any:
        if call.name == "A":
            return [1, 2, 3]
        return {call.name: call.input}

    expected = run(compile_text(text), task, {"in": 1})
    record = harness.run(compile_text(text), task, {"in": 1})
    assert expected.status == "finished"
    assert (record.status, record.output) == (expected.status, expected.output)


def test_tasks_are_routed_to_the_stream_of_their_kind(harness: Harness, redis_client) -> None:
    harness.submit(compile_text("ml:train → notify:email → plain"))
    harness.advance()
    keys = Keys()
    assert redis_client.xlen(keys.tasks("ml")) == 1
    assert redis_client.xlen(keys.tasks("notify")) == 0
    event = decode(redis_client.xrange(keys.tasks("ml"))[0][1])
    assert {"workflow", "name", "index", "input", "parameters", "key", "attempt", "id"} <= set(
        event
    )
    assert event["id"] == f"{event['workflow']}/1/1"


def test_a_replayed_end_task_changes_nothing(harness: Harness, redis_client) -> None:
    keys = Keys()
    workflow = harness.submit(compile_text("A → B"))
    harness.advance()
    harness.work(echo)
    end = redis_client.xrange(keys.lifecycle)[-1][1]
    harness.advance()
    before = redis_client.hgetall(keys.workflow(workflow))
    redis_client.xadd(keys.lifecycle, end)  # the same end-task again
    assert harness.advance() == 1
    assert redis_client.hgetall(keys.workflow(workflow)) == before
    assert redis_client.xlen(keys.tasks("default")) == 2  # A and B, B not started twice
    assert redis_client.xpending(keys.lifecycle, keys.lifecycle_group)["pending"] == 0


def test_a_duplicated_start_workflow_starts_it_once(harness: Harness, redis_client) -> None:
    graph = compile_text("A")
    harness.submit(graph, workflow_id="w1")
    harness.submit(graph, workflow_id="w1")
    harness.advance()
    assert redis_client.xlen(Keys().tasks("default")) == 1


def test_a_failing_task_is_retried_per_its_policy_then_fails_the_workflow(harness: Harness) -> None:
    attempts: list[int] = []

    def flaky(call: TaskCall) -> Any:
        attempts.append(call.attempt)
        assert "$retries" not in call.params
        raise RuntimeError("disk full")

    record = harness.run(compile_text("A (- {$retries: 2, size: 1} -) → B"), flaky)
    assert attempts == [1, 2, 3]
    assert record.status == "failed"
    assert "disk full" in record.error


def test_an_end_task_for_an_unknown_workflow_is_rejected_with_its_id(
    harness: Harness, redis_client
) -> None:
    keys = Keys()
    redis_client.xadd(keys.lifecycle, {"kind": b'"end-task"', "workflow": b'"nope"', "key": b'"1"'})
    reply = redis_client.xreadgroup(keys.lifecycle_group, "t", {keys.lifecycle: ">"})
    entries = [(i.decode(), decode(f)) for _, items in reply for i, f in items]
    result = harness.advancer.apply(entries)
    assert result.rejected and "no workflow 'nope'" in result.rejected[0][1]


def test_a_malformed_end_task_names_the_event_and_field(harness: Harness) -> None:
    result = harness.advancer.apply([("5-0", {"kind": "end-task", "workflow": 7})])
    assert result.rejected == [("5-0", "event 5-0 (end-task): field 'workflow' is 7, expected str")]


def test_the_graph_is_stored_once_for_all_its_workflows(harness: Harness, redis_client) -> None:
    graph = compile_text("A → B")
    for _ in range(3):
        harness.submit(graph)
    assert len(list(redis_client.scan_iter(match="{flow}:graph:*"))) == 1


def test_terminate_ends_a_running_workflow(harness: Harness, redis_client) -> None:
    from lifecycle.submit import terminate_workflow

    workflow = harness.submit(compile_text("A → B"))
    harness.advance()
    terminate_workflow(redis_client, workflow, "operator said so")
    harness.advance()
    record = load_workflow(redis_client, Keys(), workflow)
    assert (record.status, record.error) == ("terminated", "operator said so")
    harness.work(echo)
    harness.advance()
    assert load_workflow(redis_client, Keys(), workflow).status == "terminated"
    kinds = [decode(f)["kind"] for _, f in redis_client.xrange(Keys().lifecycle)]
    assert kinds.count("failed-workflow") == 1 and "end-workflow" not in kinds
    assert orjson.loads(redis_client.hget(Keys().workflow(workflow), "s"))["status"] == "terminated"


def test_each_ending_is_counted_once_by_its_status(harness: Harness, redis_client) -> None:
    from lifecycle.submit import terminate_workflow

    def fail_b(call: TaskCall) -> Any:
        if call.name == "B":
            raise RuntimeError("no")
        return {}

    for _ in range(3):
        harness.run(compile_text("A"), echo)
    harness.run(compile_text("A → B"), fail_b)
    stopped = harness.submit(compile_text("A → B"))
    harness.advance()
    terminate_workflow(redis_client, stopped, "stop")
    terminate_workflow(redis_client, stopped, "stop again")  # changes nothing: already ended
    harness.advance()
    end = redis_client.xrange(Keys().lifecycle)[-1][1]
    redis_client.xadd(Keys().lifecycle, end)  # a redelivered event counts nothing either
    harness.advance()
    assert redis_client.hgetall(Keys().outcomes) == {
        b"finished": b"3",
        b"failed": b"1",
        b"terminated": b"1",
    }


def _racing(other: Advancer, events: list[Any], raced: list[Any]) -> type[Advancer]:
    """An advancer class during whose first compute ``other`` applies ``events`` (what
    another worker commits between this one's WATCH and its EXEC); results in ``raced``."""

    class Racing(Advancer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            compute = self.transition.compute

            def racing_compute(item: Any, result: Any, now: int) -> Any:
                if not raced:
                    raced.append(other.apply(events))
                return compute(item, result, now)

            self.transition.compute = racing_compute  # type: ignore[method-assign]

    return Racing


def test_a_batch_whose_workflow_another_worker_advanced_meanwhile_commits_in_a_later_round(
    harness: Harness, redis_client
) -> None:
    """Two workers hold the two ends of one join; the one that loses the race writes
    nothing in its watched transaction, then commits from fresh state: D starts once."""
    keys = Keys()
    other = Advancer(redis_client, keys)
    workflow = harness.submit(compile_text("A → { B C } → D"))
    harness.advance()
    harness.work(echo)
    harness.advance()  # A ended: B and C start
    harness.work(echo)  # both end
    reply = redis_client.xreadgroup(keys.lifecycle_group, "t", {keys.lifecycle: ">"})
    (end_b, end_c) = [(i.decode(), decode(f)) for _, items in reply for i, f in items]
    raced: list[Any] = []
    result = _racing(other, [end_c], raced)(redis_client, keys).apply([end_b])
    assert raced[0].committed == 1 and raced[0].conflicts == 0
    assert (result.committed, result.conflicts) == (1, 1)
    assert sorted(result.acknowledged) == [end_b[0]]
    harness.work(echo)
    harness.advance()
    record = load_workflow(redis_client, keys, workflow)
    assert record.status == "finished"
    starts = [decode(f)["name"] for _, f in redis_client.xrange(keys.tasks("default"))]
    assert starts == ["A", "B", "C", "D"] or starts == ["A", "C", "B", "D"]
    assert redis_client.xpending(keys.lifecycle, keys.lifecycle_group)["pending"] == 0


def _ends_and_a_bystander(harness: Harness, redis_client) -> tuple[Any, Any, Any]:
    """In flight: the ends of B and C of ``A → { B C } → D``, and an entry that changes
    nothing (a workflow event of another kind), all read by consumer "t"."""
    keys = Keys()
    harness.submit(compile_text("A → { B C } → D"))
    harness.advance()
    harness.work(echo)
    harness.advance()
    harness.work(echo)
    redis_client.xadd(keys.lifecycle, {"kind": b'"end-workflow"', "workflow": b'"elsewhere"'})
    reply = redis_client.xreadgroup(keys.lifecycle_group, "t", {keys.lifecycle: ">"})
    end_b, end_c, bystander = [(i.decode(), decode(f)) for _, items in reply for i, f in items]
    return end_b, end_c, bystander


def test_events_that_change_nothing_are_acknowledged_with_the_batch_transaction(
    harness: Harness, redis_client
) -> None:
    keys = Keys()
    end_b, end_c, bystander = _ends_and_a_bystander(harness, redis_client)
    result = Advancer(redis_client, keys).apply([end_b, bystander, end_c, end_b])
    assert result.committed == 1 and result.duplicates == [bystander[0], end_b[0]]
    assert sorted(result.acknowledged) == sorted([end_b[0], end_c[0], bystander[0], end_b[0]])
    assert redis_client.xpending(keys.lifecycle, keys.lifecycle_group)["pending"] == 0


def test_when_the_watched_transaction_loses_nothing_that_changed_nothing_is_acknowledged(
    harness: Harness, redis_client
) -> None:
    keys = Keys()
    end_b, end_c, bystander = _ends_and_a_bystander(harness, redis_client)
    racing = _racing(Advancer(redis_client, keys), [end_c], [])
    result = racing(redis_client, keys).apply([end_b, bystander])
    assert (result.committed, result.conflicts) == (1, 1)
    assert result.acknowledged == [end_b[0]]  # the later round's own commit only
    assert result.duplicates == [bystander[0]]  # for the caller to acknowledge
    pending = redis_client.xpending_range(keys.lifecycle, keys.lifecycle_group, "-", "+", 10)
    assert [p["message_id"].decode() for p in pending] == [bystander[0]]


def test_a_task_that_outlives_its_timeout_is_failed_by_a_durable_timer(
    harness: Harness, redis_client
) -> None:
    from lifecycle.engine.timers import timer_pump

    keys = Keys()
    workflow = harness.submit(compile_text("slow:A (- {$timeout: 5, $retries: 1} -)"))
    harness.advance()
    timers = timer_pump(redis_client, keys)
    ((member, due),) = redis_client.zrange(keys.timers, 0, -1, withscores=True)
    assert timers.fire_due(int(due) - 1) == 0  # not yet
    assert timers.fire_due(int(due)) == 1
    harness.advance()  # timeout-task: attempt 1 failed, attempt 2 starts with a new timer
    starts = [decode(f) for _, f in redis_client.xrange(keys.tasks("slow"))]
    assert [s["attempt"] for s in starts] == [1, 2] and starts[1]["input"] == starts[0]["input"]
    ((_, due2),) = redis_client.zrange(keys.timers, 0, -1, withscores=True)
    timers.fire_due(int(due2))
    harness.advance()
    record = load_workflow(redis_client, keys, workflow)
    assert record.status == "failed" and "timed out after 5.0s" in record.error
    assert redis_client.zcard(keys.timers) == 0


def test_an_end_before_the_timeout_cancels_the_timer(harness: Harness, redis_client) -> None:
    keys = Keys()
    harness.run(compile_text("A (- $timeout: 30 -)"), echo)
    assert redis_client.zcard(keys.timers) == 0


def test_a_retry_after_backoff_waits_on_a_durable_timer(harness: Harness, redis_client) -> None:
    from lifecycle.engine.timers import timer_pump

    keys = Keys()
    calls: list[int] = []

    def fails_once(call: TaskCall) -> Any:
        calls.append(call.attempt)
        if call.attempt == 1:
            raise RuntimeError("flaky")
        return {"ok": call.attempt}

    workflow = harness.submit(compile_text("A (- {$retries: 2, $backoff: 60} -)"))
    harness.pump(fails_once)
    assert calls == [1]  # attempt 2 waits for its timer
    ((_, due),) = redis_client.zrange(keys.timers, 0, -1, withscores=True)
    timer_pump(redis_client, keys).fire_due(int(due))
    harness.pump(fails_once)
    assert calls == [1, 2]
    assert load_workflow(redis_client, keys, workflow).output == {"ok": 2}


def test_a_cycle_runs_on_redis_with_a_new_task_instance_id_each_round(
    harness: Harness, redis_client
) -> None:
    from lifecycle.submit import terminate_workflow

    keys = Keys()
    workflow = harness.submit(compile_text("A → B → :start"))
    for _ in range(8):
        harness.advance()
        harness.work(echo)
    terminate_workflow(redis_client, workflow)
    harness.pump(echo)
    ids = [decode(f)["id"] for _, f in redis_client.xrange(keys.tasks("default"))]
    assert len(ids) >= 6 and len(set(ids)) == len(ids)
    assert f"{workflow}/1/3" in ids  # A's third round
    assert load_workflow(redis_client, keys, workflow).status == "terminated"
