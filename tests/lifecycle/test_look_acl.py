"""The read-only user documented in docs/security.md runs every looking command
(status, inspect, list, history, dead-letters list/show) with no command refused."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from flowlang.compiler import compile_text
from flowstream.cli import main
from lifecycle.client import Client
from lifecycle.dead_letters import list_dead_letters
from lifecycle.keys import RECEIPTS_GROUP, TASK_GROUP, Keys
from rqse.deadletter import PROCESS_ERROR, dead_letter_fields
from rqse.keys import dead_letter_key
from tests.lifecycle.harness import Harness

KEYS = Keys()
SECURITY = Path(__file__).resolve().parents[2] / "docs" / "security.md"
PASSWORD = "reader-secret"


def reader_rules() -> list[str]:
    line = next(
        line
        for line in SECURITY.read_text(encoding="utf-8").splitlines()
        if line.startswith("ACL SETUSER flowstream-reader ")
    )
    words = shlex.split(line)[3:]
    return [f">{PASSWORD}" if w == ">PASSWORD" else w for w in words]


@pytest.fixture
def reader_url(redis_client: redis.Redis, redis_url: str) -> Iterator[str]:
    redis_client.execute_command("ACL", "SETUSER", "flowstream-reader", *reader_rules())
    redis_client.execute_command("ACL", "LOG", "RESET")
    parts = urlsplit(redis_url)
    url = urlunsplit(parts._replace(netloc=f"flowstream-reader:{PASSWORD}@{parts.netloc}"))
    try:
        yield url
    finally:
        redis_client.execute_command("ACL", "DELUSER", "flowstream-reader")


def refusals(client: redis.Redis) -> list[str]:
    """The ACL log's refusals, but CONFIG GET's: no documented line grants it (it would
    read the server's password too), so status then leaves the server's risks unchecked."""
    entries: Any = client.acl_log()
    found = [f"{e.get('reason')} {e.get('object')}" for e in entries]
    return [f for f in found if f != "command config|get"]


def test_the_reader_user_runs_every_looking_command_without_a_refusal(
    redis_client: redis.Redis, reader_url: str, harness: Harness, capsys: Any
) -> None:
    workflow_id = harness.submit(compile_text("A → ml:B"), workflow_id="wf-r")
    harness.advance()
    harness.work(lambda call: call.input)
    harness.advance()
    redis_client.xgroup_create(KEYS.lifecycle, RECEIPTS_GROUP, id="$")
    redis_client.xtrim(KEYS.lifecycle, maxlen=0, approximate=False)  # part of it gone
    redis_client.xadd(
        dead_letter_key(KEYS.tasks("ml")),
        dead_letter_fields(
            stream=KEYS.tasks("ml"),
            group=TASK_GROUP,
            consumer="w",
            entry_id="1-1",
            fields={b"kind": b'"start-task"'},
            reason=PROCESS_ERROR,
            error="boom",
            deliveries=1,
        ),
    )
    dead_id = list_dead_letters(redis_client, KEYS)[0].id
    # A queued start-task of a terminated workflow: status checks its workflow.
    harness.submit(compile_text("ml:C"), workflow_id="wf-ended")
    harness.advance()
    Client(redis_client).terminate("wf-ended")
    harness.advance()
    redis_client.set(KEYS.archive, b'{"path": "/nowhere", "host": "elsewhere"}')
    for argv in (
        ["status"],
        ["status", "--json"],
        ["list"],
        ["inspect", workflow_id],
        ["history", workflow_id],
        ["dead-letters", "list"],
        ["dead-letters"],
        ["dead-letters", "show", dead_id],
    ):
        code = main([*argv, "--redis-url", reader_url])
        err = capsys.readouterr().err
        assert code in (0, 1) and "refused" not in err, f"{argv}: {err}"
    assert refusals(redis_client) == []
    code = main(["status", "--json", "--redis-url", reader_url])
    assert "1 queued task of ended workflows" in capsys.readouterr().out
    assert re.search(r"\+xinfo\|consumers", " ".join(reader_rules()))
