"""The resource worker on a real Redis: the start-task's role decides source or sink; every
failure is a FAILURE end-task with one line naming the URI."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from lifecycle.keys import Keys
from rqse import message
from rqse.events import encode_event
from tests.workers.helpers import Threads, events, submit, wait_for_end
from tests.workers.http_servers import Site, body, serve
from workers.noop import NoopWorker
from workers.resources import ResourceWorker

KEYS = Keys()


def start_task(name: str, role: str | None, input: Any = None, **parameters: Any) -> dict:
    """A resource start-task as the engine writes it (docs/events.md), ``role`` included."""
    event: dict[str, Any] = {
        "workflow": "wf1",
        "name": name,
        "index": 0,
        "key": "0",
        "attempt": 1,
        "id": "wf1/0/1",
        "token": "t0k3n",
        "input": input,
        "parameters": parameters,
    }
    if role is not None:
        event["role"] = role
    return encode_event(message(event, kind="start-task"))


def run_tasks(redis_url: str, client: redis.Redis, *tasks: dict, **settings: Any) -> list[dict]:
    """The end-tasks a ResourceWorker answers ``tasks`` with, in order."""
    for task in tasks:
        client.xadd(KEYS.tasks("resource"), task)
    worker = ResourceWorker(url=redis_url, handle_signals=False, block_ms=50, **settings)
    worker.listen(idle_timeout=0.3)
    return [
        {k.decode(): orjson.loads(v) for k, v in fields.items()}
        for _, fields in client.xrange(KEYS.lifecycle)
        if fields.get(b"kind") == b'"end-task"'
    ]


@pytest.fixture
def site() -> Iterator[Site]:
    pages = Site()
    pages.routes["/orders"] = body(b'[{"id": 1}, {"id": 2}]')
    pages.routes["/result.json"] = body(b"", status=204)
    with serve(pages) as served:
        yield served


def test_the_role_decides_whether_a_uri_is_loaded_or_stored(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    (tmp_path / "orders.json").write_text('[{"id": 1}]')
    ends = run_tasks(
        redis_url,
        redis_client,
        start_task("orders.json", "source"),
        start_task("copy.json", "sink", [{"id": 1}, {"id": 2}]),
        # the same URI as a sink: the role, not the position in a graph, decides
        start_task("orders.json", "sink", {"replaced": True}),
        base_dir=tmp_path,
    )
    assert [(e["status"], e.get("output")) for e in ends] == [
        ("SUCCESS", [{"id": 1}]),
        ("SUCCESS", [{"id": 1}, {"id": 2}]),
        ("SUCCESS", {"replaced": True}),
    ]
    assert {e["token"] for e in ends} == {"t0k3n"}  # echoed: the lifecycle checks it
    assert orjson.loads((tmp_path / "copy.json").read_bytes()) == [{"id": 1}, {"id": 2}]
    assert orjson.loads((tmp_path / "orders.json").read_bytes()) == {"replaced": True}


@pytest.mark.parametrize(
    ("role", "error"),
    [
        (None, "ResourceError: in.json: start-task has no role (expected 'source' or 'sink')"),
        ("both", "ResourceError: in.json: role 'both', expected 'source' or 'sink'"),
    ],
)
def test_a_start_task_without_a_valid_role_fails_and_touches_nothing(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, role: str | None, error: str
) -> None:
    (tmp_path / "in.json").write_text("[1]")
    (end,) = run_tasks(
        redis_url, redis_client, start_task("in.json", role, {"x": 1}), base_dir=tmp_path
    )
    assert (end["status"], end["error"]) == ("FAILURE", error)
    assert (tmp_path / "in.json").read_text() == "[1]"


def test_http_sources_and_sinks_reach_only_the_allowed_networks(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, site: Site
) -> None:
    tasks = (
        start_task(f"{site.url}/orders", "source"),
        start_task(f"{site.url}/result.json", "sink", {"total": 2}),
    )
    allowed = run_tasks(redis_url, redis_client, *tasks, allow_networks=["127.0.0.0/8"])
    assert [e["status"] for e in allowed] == ["SUCCESS", "SUCCESS"]
    assert allowed[0]["output"] == [{"id": 1}, {"id": 2}]
    assert orjson.loads(site.requests[-1][3]) == {"total": 2}
    redis_client.flushdb()
    site.requests.clear()
    refused = run_tasks(redis_url, redis_client, *tasks)
    assert [e["status"] for e in refused] == ["FAILURE", "FAILURE"]
    assert refused[0]["error"] == (
        f"ResourceError: {site.url}/orders: GET refused: 127.0.0.1 resolves to loopback "
        "address 127.0.0.1 (outside the allowed networks)"
    )
    assert site.requests == []


def test_a_failure_is_one_line_naming_the_uri(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    ends = run_tasks(
        redis_url,
        redis_client,
        start_task("nothing.json", "source"),
        start_task("../up.json", "source"),
        start_task("hook.py", "sink", {"x": 1}),
        start_task("in.json", "source", format="toml"),
        base_dir=tmp_path,
    )
    errors = [e["error"] for e in ends]
    assert errors[0].startswith("ResourceError: nothing.json: cannot read ")
    assert errors[1].startswith("ResourceError: ../up.json: '..' is not allowed")
    assert errors[2].startswith("ResourceError: hook.py: refused: code file 'hook.py'")
    assert errors[3] == "ResourceError: in.json: format 'toml', expected 'json' or 'yaml'"
    assert all("\n" not in error for error in errors)


def test_a_flow_with_a_file_source_and_http_and_file_sinks_runs_through_the_engine(
    redis_client: redis.Redis, threads: Threads, tmp_path: Path, site: Site
) -> None:
    (tmp_path / "orders.json").write_text('[{"id": 1}, {"id": 2}]')
    threads.lifecycle()
    options = {"pool": threads.pool, "handle_signals": False, "block_ms": 100}
    threads.start(ResourceWorker(base_dir=tmp_path, allow_networks=["127.0.0.0/8"], **options))
    threads.start(NoopWorker(["default"], **options))
    flow = f"<orders.json> → * check → <{site.url}/result.json>"
    final = wait_for_end(redis_client, submit(redis_client, flow))
    assert final == {"status": "finished", "output": [{"id": 1}, {"id": 2}]}
    assert orjson.loads(site.requests[-1][3]) == [{"id": 1}, {"id": 2}]
    copied = wait_for_end(redis_client, submit(redis_client, "<orders.json> → <copy.json>"))
    assert copied["status"] == "finished"
    assert orjson.loads((tmp_path / "copy.json").read_bytes()) == [{"id": 1}, {"id": 2}]
    roles = {e["name"]: e["role"] for _, e in events(redis_client, KEYS.tasks("resource"))}
    assert roles == {
        "orders.json": "source",
        f"{site.url}/result.json": "sink",
        "copy.json": "sink",
    }


def test_a_source_path_leaving_the_root_fails_the_workflow_with_the_uri(
    redis_client: redis.Redis, threads: Threads, tmp_path: Path
) -> None:
    threads.lifecycle()
    options = {"pool": threads.pool, "handle_signals": False, "block_ms": 100}
    threads.start(ResourceWorker(base_dir=tmp_path, **options))
    final = wait_for_end(redis_client, submit(redis_client, "<../secret.json> → <out.json>"))
    assert final["status"] == "failed"
    assert "ResourceError: ../secret.json: '..' is not allowed" in final["error"]


def test_a_bad_allowed_network_refuses_to_build_the_worker(redis_url: str) -> None:
    with pytest.raises(ValueError, match=r"allowed network '300\.0\.0\.0/8'"):
        ResourceWorker(url=redis_url, handle_signals=False, allow_networks=["300.0.0.0/8"])


def test_the_worker_does_not_load_the_engine_store() -> None:
    # The role comes with the event; the worker needs neither the graph nor its cache.
    code = "import sys, workers.resources; print('lifecycle.engine.store' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.stdout.strip() == "False", loaded.stderr
