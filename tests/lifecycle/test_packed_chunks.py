"""A read of many end-tasks entries is advanced in chunks of a bounded count of answers."""

from __future__ import annotations

from typing import Any

import redis

from flowlang.compiler import compile_text
from lifecycle import events as ev
from lifecycle.keys import Keys
from lifecycle.submit import start_workflows
from lifecycle.worker import _CHUNK_ANSWERS, LifecycleWorker, _chunks
from tests.lifecycle.harness import decode
from workers.answers import PACK_ANSWERS
from workers.noop import NoopWorker

KEYS = Keys()


def _pack(n: int) -> dict[str, Any]:
    return {"kind": ev.END_TASKS, "answers": [["w", "1", 1, "t", {}]] * n}


def test_a_batch_of_packs_is_cut_where_its_answers_would_pass_the_bound() -> None:
    over_half = _CHUNK_ANSWERS // 2 + 50  # two such packs do not fit in one chunk
    batch = [("1-0", _pack(over_half)), ("2-0", _pack(over_half)), ("3-0", {"kind": ev.END_TASK})]
    batch += [("4-0", _pack(_CHUNK_ANSWERS + 50))]  # larger than a chunk: a chunk of its own
    chunks = _chunks(batch)
    assert [[entry_id for entry_id, _ in chunk] for chunk in chunks] == [
        ["1-0"],
        ["2-0", "3-0"],
        ["4-0"],
    ]


def test_other_entries_count_one_each() -> None:
    batch = [(f"{n}-0", {"kind": ev.END_TASK}) for n in range(_CHUNK_ANSWERS + 1)]
    assert [len(chunk) for chunk in _chunks(batch)] == [_CHUNK_ANSWERS, 1]


def test_a_read_of_more_answers_than_a_chunk_holds_is_advanced_whole_by_the_lifecycle_worker(
    redis_client: redis.Redis,
) -> None:
    graph = compile_text("A → B")
    count = _CHUNK_ANSWERS + 100
    start_workflows(redis_client, graph, [{"n": n} for n in range(count)], None, KEYS)
    lifecycle = LifecycleWorker(KEYS, pool=redis_client.connection_pool, handle_signals=False)
    worker = NoopWorker(
        ["default"], KEYS, pool=redis_client.connection_pool, handle_signals=False,
        batch_size=count, pack_answers=True,
    )  # fmt: skip
    for _ in range(6):
        lifecycle.listen(idle_timeout=0.2)
        worker.listen(idle_timeout=0.2)
    kinds = [decode(f)["kind"] for _, f in redis_client.xrange(KEYS.lifecycle)]
    assert kinds.count(ev.END_TASKS) == 2 * -(-count // PACK_ANSWERS)  # A's, then B's
    assert redis_client.hget(KEYS.outcomes, "finished") == str(count).encode()
    assert redis_client.xpending(KEYS.lifecycle, KEYS.lifecycle_group)["pending"] == 0
