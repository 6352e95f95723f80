"""Compaction and the removal of compacted workflows under the users docs/security.md
documents: the lifecycle user's retention pump compacts and removes, the operator user
deletes a compacted workflow, and no command is refused."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall
from lifecycle.client import Client
from lifecycle.engine.advance import Advancer
from lifecycle.engine.retention import retention_pump
from lifecycle.keys import Keys
from tests.lifecycle.harness import Harness

KEYS = Keys()
SECURITY = Path(__file__).resolve().parents[2] / "docs" / "security.md"
PASSWORD = "compact-secret"
USERS = ("flowstream-lifecycle", "flowstream-operator")
HOUR = 3_600_000


def rules(user: str) -> list[str]:
    line = next(
        line
        for line in SECURITY.read_text(encoding="utf-8").splitlines()
        if line.startswith(f"ACL SETUSER {user} reset")
    )
    return [f">{PASSWORD}" if w == ">PASSWORD" else w for w in shlex.split(line)[3:]]


@pytest.fixture
def users(redis_client: redis.Redis, redis_url: str) -> Iterator[dict[str, redis.Redis]]:
    for user in USERS:
        redis_client.execute_command("ACL", "SETUSER", user, *rules(user))
    redis_client.execute_command("ACL", "LOG", "RESET")
    parts = urlsplit(redis_url)
    clients = {
        user: redis.Redis.from_url(
            urlunsplit(parts._replace(netloc=f"{user}:{PASSWORD}@{parts.netloc}"))
        )
        for user in USERS
    }
    try:
        yield clients
    finally:
        for client in clients.values():
            client.close()
        for user in USERS:
            redis_client.execute_command("ACL", "DELUSER", user)


def ok(call: TaskCall) -> Any:
    return {"seen": call.input}


def test_the_documented_users_compact_remove_and_delete_with_nothing_refused(
    redis_client: redis.Redis, users: dict[str, redis.Redis]
) -> None:
    lifecycle, operator = users["flowstream-lifecycle"], users["flowstream-operator"]
    harness = Harness(redis_client, KEYS)
    harness.advancer = Advancer(lifecycle, KEYS, retain_ms=HOUR, keep_details_ms=0)
    for workflow_id in ("kept", "deleted"):
        harness.submit(compile_text("@flow f\nA → B"), {"n": 1}, workflow_id)
    harness.pump(ok)
    pump = retention_pump(lifecycle, KEYS)
    assert pump.fire_due() == 2
    assert redis_client.hlen(KEYS.compacted) == 2
    assert Client(operator, KEYS).status("deleted").state == "finished"
    Client(operator, KEYS).delete("deleted")
    harness.advance()
    assert redis_client.hkeys(KEYS.compacted) == [b"kept"]
    assert pump.fire_due(int(redis_client.time()[0]) * 1000 + HOUR + 1000) == 2
    assert not redis_client.exists(KEYS.compacted, KEYS.workflow("deleted"))
    assert redis_client.zcard(KEYS.workflows) == 0
    entries: Any = redis_client.acl_log()
    assert [f"{e.get('reason')} {e.get('object')}" for e in entries] == []


def test_the_operator_writes_no_workflow_record_compacted_or_not(
    redis_client: redis.Redis, users: dict[str, redis.Redis]
) -> None:
    # A delete is the lifecycle's to carry out: the operator only sends the event.
    operator = users["flowstream-operator"]
    redis_client.hset(KEYS.compacted, "wf", "1")
    for command in (
        ("HSET", KEYS.workflow("wf"), "v", "1"),
        ("HDEL", KEYS.compacted, "wf"),
        ("HSET", KEYS.compacted, "wf", "2"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            operator.execute_command(*command)
    assert redis_client.hget(KEYS.compacted, "wf") == b"1"
    redis_client.execute_command("ACL", "LOG", "RESET")  # (the refusals above)
