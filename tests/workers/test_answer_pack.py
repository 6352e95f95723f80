"""A pack of answers stays under its size, and a task listener packs its batch's answers."""

from __future__ import annotations

from typing import Any

import orjson
import redis

from flowlang.compiler import compile_text
from lifecycle import events as ev
from lifecycle.client import Client
from lifecycle.keys import Keys
from tests.lifecycle.harness import Harness, decode
from workers.answers import AnswerPack
from workers.task import Task, TaskListener

KEYS = Keys()


def test_a_pack_never_passes_its_size_and_an_answer_larger_than_a_pack_goes_alone() -> None:
    sent: list[tuple[Any, ...]] = []
    pack = AnswerPack(lambda *command: sent.append(command), "s", "w", most_bytes=100)
    answer = (b'"wf"', b'"1"', b"1", b'"token"', b'{"v":"' + b"x" * 40 + b'"}')
    assert pack.add(*answer) and pack.add(*answer)  # 66 bytes each: the second starts a pack
    assert len(sent) == 1
    assert not pack.add(b'"wf"', b'"1"', b"1", b'"t"', b'"' + b"y" * 100 + b'"')
    pack.send_pack()
    pack.send_pack()  # nothing left: nothing sent
    assert len(sent) == 2
    for command in sent:
        fields = dict(zip(command[3::2], command[4::2], strict=True))
        assert len(fields[b"answers"]) <= 100
        parts, bad = ev.parse_end_tasks(
            "1-1", {k.decode(): orjson.loads(v) for k, v in fields.items()}
        )
        assert len(parts) == 1 and not bad


class _Doubler(TaskListener):
    kind = "default"
    pack_answers = True

    def run(self, task: Task) -> Any:
        if task.input.get("n") == 3:
            raise RuntimeError("three is refused")
        return {"n": task.input["n"] * 2}


def test_a_cleared_pack_sends_nothing_of_what_it_held() -> None:
    sent: list[tuple[Any, ...]] = []
    pack = AnswerPack(lambda *command: sent.append(command), "s", "w")
    assert pack.add(b'"wf"', b'"1"', b"1", b'"t"', b"{}")
    pack.clear()
    pack.send_pack()
    assert sent == []


def test_a_pack_holds_at_most_its_count_of_answers() -> None:
    sent: list[tuple[Any, ...]] = []
    pack = AnswerPack(lambda *command: sent.append(command), "s", "w", most_answers=3)
    for n in range(7):
        assert pack.add(b'"wf"', b'"%d"' % n, b"1", b'"t"', b"{}")
    pack.send_pack()
    counts = [len(orjson.loads(dict(zip(c[3::2], c[4::2], strict=True))[b"answers"])) for c in sent]
    assert counts == [3, 3, 1]


def test_a_task_listener_sends_its_batchs_answers_as_one_entry_and_failures_alone(
    redis_client: redis.Redis,
) -> None:
    harness = Harness(redis_client)
    ids = [harness.submit(compile_text("A → B"), {"n": n}, f"t{n}") for n in range(6)]
    harness.advance()
    listener = _Doubler(pool=redis_client.connection_pool, handle_signals=False, batch_size=10)
    assert listener.listen(idle_timeout=0.1) == 6
    answers = [decode(f) for _, f in redis_client.xrange(KEYS.lifecycle)][6:]  # after the starts
    assert sorted(a["kind"] for a in answers) == [ev.END_TASK, ev.END_TASKS]
    (packed,) = [a for a in answers if a["kind"] == ev.END_TASKS]
    assert sorted(a[4]["n"] for a in packed["answers"]) == [0, 2, 4, 8, 10]
    for _ in range(5):
        harness.advance()
        listener.listen(idle_timeout=0.1)
    states = [Client(redis_client, KEYS).status(i).state for i in ids]
    assert states == ["finished"] * 3 + ["failed"] + ["finished"] * 2
