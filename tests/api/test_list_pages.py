"""The list's pages (lifecycle.inspect.list_page, behind GET /api/workflows): every
workflow once, newest first, also when many share a creation time."""

from __future__ import annotations

import orjson
import pytest
import redis

from lifecycle.inspect import LIST_PAGE, list_page
from lifecycle.keys import Keys

KEYS = Keys()


def store(client: redis.Redis, ids_by_ms: dict[str, int]) -> None:
    pipe = client.pipeline(transaction=False)
    for workflow_id, ms in ids_by_ms.items():
        pipe.zadd(KEYS.workflows, {workflow_id: ms})
        pipe.hset(
            KEYS.workflow(workflow_id),
            mapping={"s": orjson.dumps({"status": "finished"}), "created": ms, "v": 1},
        )
    pipe.execute()


def pages(client: redis.Redis, limit: int, **filters: str) -> list[list[str]]:
    found, cursor = [], None
    while True:
        rows, cursor = list_page(client, KEYS, limit=limit, cursor=cursor, **filters)
        found.append([row["id"] for row in rows])
        if cursor is None:
            return found


@pytest.mark.parametrize(("limit", "state"), [(97, ""), (3, ""), (97, "finished")])
def test_workflows_created_in_one_millisecond_are_each_listed_once(
    redis_client: redis.Redis, limit: int, state: str
) -> None:
    # More than one read of the index share the same score: the cursor must step
    # over the ties already listed, not by position.
    tied = {f"w{i:04d}": 1_700_000_000_000 for i in range(LIST_PAGE + 150)}
    store(redis_client, {**tied, "newest": 1_700_000_000_001, "oldest": 1_600_000_000_000})
    listed = pages(redis_client, limit=limit, state=state)
    flat = [workflow_id for page in listed for workflow_id in page]
    assert len(flat) == len(set(flat)) == len(tied) + 2
    assert flat[0] == "newest" and flat[-1] == "oldest"
    assert all(len(page) == limit for page in listed[:-2])


def test_a_workflow_removed_between_pages_shifts_no_other(redis_client: redis.Redis) -> None:
    store(redis_client, {f"w{i}": 1_700_000_000_000 + i for i in range(10)})
    first, cursor = list_page(redis_client, KEYS, limit=4)
    redis_client.delete(KEYS.workflow("w9"))  # one already listed goes away
    rest, _ = list_page(redis_client, KEYS, limit=100, cursor=cursor)
    assert [r["id"] for r in first] == ["w9", "w8", "w7", "w6"]
    assert [r["id"] for r in rest] == [f"w{i}" for i in range(5, -1, -1)]
