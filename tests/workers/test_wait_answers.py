"""What the built-in wait: kind answers: the attempt's token on every end-task, events only
from those they are addressed to, and a bad task failing alone in its batch."""

from __future__ import annotations

from typing import Any

import redis

from lifecycle.keys import TASK_GROUP
from rqse.events import encode_event
from rqse.keys import dead_letter_key
from tests.conftest import wait_until
from tests.workers.helpers import KEYS, Threads, events, state, submit, wait_for_end
from workers.wait import WaitTaskListener, WaitWorker
from workers.wait_events import addressed_to


def wait_worker(threads: Threads) -> WaitWorker:
    worker = WaitWorker(pool=threads.pool, handle_signals=False, block_ms=100, poll_interval=0.02)
    return threads.start(worker)


def tokens_by_attempt(client: redis.Redis, stream: str, kind: str) -> dict[tuple, Any]:
    return {
        (e["workflow"], e["key"], e["attempt"]): e.get("token")
        for _, e in events(client, stream, kind)
    }


def test_every_wait_answer_echoes_its_start_tasks_token_and_is_accepted(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    wait_worker(threads)
    delay = submit(redis_client, "wait:delay (- duration: 0.2 -)", {"d": 1})
    at_once = submit(redis_client, "wait:delay (- duration: 0 -)", {"d": 0})
    event = submit(redis_client, "wait:event (- event: ping -)", {"e": 1})
    bad = submit(redis_client, "wait:delay (- duration: never -)", {})
    acquire = submit(redis_client, "wait:acquire (- name: tok -)", {})
    assert wait_for_end(redis_client, acquire)["status"] == "finished"
    countdown = submit(redis_client, "wait:countdown (- name: tok -)", {})
    wait_until(lambda: redis_client.scard(KEYS.latch_waiters("tok")), what="the countdown")
    release = submit(redis_client, "wait:release (- name: tok -)", {})
    wait_until(lambda: redis_client.hlen(KEYS.wait_events("ping")), what="the event wait")
    redis_client.xadd(KEYS.lifecycle, encode_event({"kind": "ping", "workflow": event}))

    ended = {w: wait_for_end(redis_client, w)["status"] for w in (delay, at_once, event, bad)}
    ended |= {w: wait_for_end(redis_client, w)["status"] for w in (countdown, release)}
    assert ended == {
        delay: "finished",
        at_once: "finished",
        event: "finished",
        bad: "failed",
        countdown: "finished",
        release: "finished",
    }
    started = tokens_by_attempt(redis_client, KEYS.tasks("wait"), "start-task")
    answered = tokens_by_attempt(redis_client, KEYS.lifecycle, "end-task")
    assert len(answered) == 7 and all(started.values())
    assert answered == started  # each answer carries its own attempt's token
    assert redis_client.xlen(dead_letter_key(KEYS.lifecycle)) == 0


def test_workflow_b_cannot_receive_an_event_addressed_to_workflow_a(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    wait_worker(threads)
    flow = "wait:event (- {event: paid, match: {order: 7}} -)"
    a = submit(redis_client, flow, {})
    b = submit(redis_client, flow, {})
    wait_until(lambda: redis_client.hlen(KEYS.wait_events("paid")) == 2, what="both waits")
    # Unaddressed, and addressed to A: B's match {order: 7} fits both, but neither is B's.
    redis_client.xadd(KEYS.lifecycle, encode_event({"kind": "paid", "order": 7, "output": 0}))
    secret = {"kind": "paid", "workflow": a, "order": 7, "output": {"card": "A's"}}
    redis_client.xadd(KEYS.lifecycle, encode_event(secret))
    assert wait_for_end(redis_client, a) == {"status": "finished", "output": {"card": "A's"}}
    # The watcher reads in order: by A's end it has read both events.
    assert state(redis_client, b)["status"] == "running"
    assert redis_client.hkeys(KEYS.wait_events("paid")) == [f"{b}/1/1".encode()]
    own = {"kind": "paid", "workflow": b, "order": 7, "output": {"card": "B's"}}
    redis_client.xadd(KEYS.lifecycle, encode_event(own))
    assert wait_for_end(redis_client, b) == {"status": "finished", "output": {"card": "B's"}}


def test_an_event_sent_to_a_channel_reaches_every_workflow_whose_flow_names_it(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    wait_worker(threads)
    listening = [
        submit(redis_client, "wait:event (- {event: news, channel: '{input[c]}'} -)", {"c": "n1"})
        for _ in range(2)
    ]
    other = submit(redis_client, "wait:event (- {event: news, channel: n2} -)", {})
    wait_until(lambda: redis_client.hlen(KEYS.wait_events("news")) == 3, what="the waits")
    news = {"kind": "news", "channel": "n1", "output": {"headline": "x"}}
    redis_client.xadd(KEYS.lifecycle, encode_event(news))
    for workflow in listening:
        assert wait_for_end(redis_client, workflow)["output"] == {"headline": "x"}
    assert state(redis_client, other)["status"] == "running"


def test_an_event_is_addressed_by_workflow_or_by_channel_only() -> None:
    wait = {"workflow": "wf-b", "channel": None}
    assert addressed_to({"workflow": "wf-b"}, "wf-b/1/1", wait)
    assert not addressed_to({"workflow": "wf-a"}, "wf-b/1/1", wait)
    assert not addressed_to({}, "wf-b/1/1", wait)
    assert not addressed_to({"channel": None}, "wf-b/1/1", wait)
    with_channel = {"workflow": "wf-b", "channel": "orders"}
    assert addressed_to({"workflow": "wf-a", "channel": "orders"}, "wf-b/1/1", with_channel)
    assert not addressed_to({"channel": "other"}, "wf-b/1/1", with_channel)
    # A wait registered before the workflow was recorded: the task id names it.
    assert addressed_to({"workflow": "wf/b"}, "wf/b/3.0/1", {"match": None})


def raw_start_task(workflow: str, name: str, parameters: str, input: bytes) -> dict[str, bytes]:
    """A start-task as raw stream fields (JSON text), for values orjson cannot write."""
    return {
        "kind": b'"start-task"',
        "workflow": f'"{workflow}"'.encode(),
        "name": f'"{name}"'.encode(),
        "index": b"1",
        "key": b'"1"',
        "attempt": b"1",
        "id": f'"{workflow}/1/1"'.encode(),
        "token": b'"t0k"',
        "input": input,
        "parameters": parameters.encode(),
    }


def test_a_wait_task_that_cannot_render_fails_alone_and_its_batch_goes_on(
    redis_url: str, redis_client: redis.Redis
) -> None:
    # An integer beyond 64 bits: orjson reads it as a float, but beside a NaN the field is
    # read by json, which keeps it an int, and no JSON encoder of ours can write it back.
    huge = b"1" + b"0" * 30 + b', "x": NaN'
    stream = KEYS.tasks("wait")
    redis_client.xgroup_create(stream, TASK_GROUP, id="0", mkstream=True)
    bad_match = raw_start_task(
        "w-bad", "wait:event", '{"event": "e", "match": "input"}', b'{"n": ' + huge + b"}"
    )
    bad_delay = raw_start_task("w-big", "wait:delay", '{"duration": ' + huge.decode() + "}", b"{}")
    bad_output = raw_start_task(
        "w-out", "wait:acquire", '{"name": "{input[n]}"}', b'{"n": ' + huge + b"}"
    )
    good = raw_start_task("w-ok", "wait:acquire", '{"name": "ok"}', b'{"fine": 1}')
    for fields in (bad_match, bad_delay, bad_output, good):
        redis_client.xadd(stream, fields)
    listener = WaitTaskListener(url=redis_url, handle_signals=False, block_ms=50, batch_size=10)
    listener.listen(idle_timeout=0.3)

    answers = {e["workflow"]: e for _, e in events(redis_client, KEYS.lifecycle, "end-task")}
    dead = [e for _, e in events(redis_client, dead_letter_key(stream))]
    assert set(answers) == {"w-bad", "w-big", "w-out", "w-ok"}, dead
    assert answers["w-ok"]["status"] == "SUCCESS" and answers["w-ok"]["output"] == {"fine": 1}
    for workflow in ("w-bad", "w-big", "w-out"):
        answer = answers[workflow]
        assert answer["status"] == "FAILURE" and answer["token"] == "t0k", answer
        assert "\n" not in answer["error"]
    assert "cannot be the wait's output" in answers["w-bad"]["error"]
    assert "more than 100 years" in answers["w-big"]["error"]
    assert "cannot be the wait's output" in answers["w-out"]["error"]
    assert redis_client.xlen(dead_letter_key(stream)) == 0
    assert redis_client.xpending(stream, TASK_GROUP)["pending"] == 0


def test_an_event_whose_output_breaks_the_limits_fails_its_wait_and_no_other(
    redis_client: redis.Redis, threads: Threads
) -> None:
    threads.lifecycle()
    wait_worker(threads)
    flow = "wait:event (- event: deep -)"
    deep, fine = submit(redis_client, flow, {}), submit(redis_client, flow, {})
    wait_until(lambda: redis_client.hlen(KEYS.wait_events("deep")) == 2, what="the waits")
    too_deep = b"[" * 300 + b"0" + b"]" * 300  # JSON text: orjson cannot even write it
    redis_client.xadd(
        KEYS.lifecycle,
        {"kind": b'"deep"', "workflow": f'"{deep}"'.encode(), "output": too_deep},
    )
    redis_client.xadd(
        KEYS.lifecycle, encode_event({"kind": "deep", "workflow": fine, "output": {"ok": 1}})
    )
    assert wait_for_end(redis_client, fine) == {"status": "finished", "output": {"ok": 1}}
    final = wait_for_end(redis_client, deep)
    assert final["status"] == "failed"
    assert "output nests deeper than 256 levels" in final["error"]
    assert redis_client.xlen(dead_letter_key(KEYS.lifecycle)) == 0
