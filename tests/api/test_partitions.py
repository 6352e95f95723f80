"""The API on a deployment of three partitions: a lifecycle worker started with
``--partitions 3`` (one Redis server: partitions need no cluster), a no-op task worker
for kind ``default``, and every route finding a workflow's partition or walking them
all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis
from redis.cluster import RedisCluster

from flowstream.api.context import ApiConfig
from lifecycle.deployment import Deployment
from lifecycle.keys import TASK_GROUP, Keys
from lifecycle.partitions import Partitions
from rqse import EventListener
from rqse.cluster import Connections
from rqse.connection import RedisSettings
from rqse.keys import dead_letter_key
from rqse.server import LocalCluster
from tests.api.conftest import OPERATE_TOKEN, TOKENS, Served, run_server, wait_state
from tests.conftest import wait_until
from tests.processes import Processes

COUNT = 3
PARTITIONS = Partitions("{flow}", COUNT)
HOLD = "hold:A"  # no worker serves kind hold: its workflows stay running


@pytest.fixture
def partitioned(redis_client: redis.Redis, processes: Processes) -> Iterator[Served]:
    """The API (tokens as in conftest) on a deployment of three partitions."""
    processes.start("lifecycle", "worker", "--partitions", str(COUNT), "--consumer", "lc")
    # The task worker and the API read the stored count once: they start after the
    # lifecycle worker has stored it.
    wait_until(lambda: redis_client.get(Keys().partitions), 20, "the partition count stored")
    noop = ("--kinds", "default", "--consumer", "noop", "--partitions", str(COUNT))
    processes.start("workers", "noop", *noop)
    server, thread, url = run_server(ApiConfig(redis_client, Keys(), TOKENS, poll_s=0.1))
    try:
        yield Served(url, redis_client, Keys())
    finally:
        server.should_exit = True
        thread.join(5)


def start(http: httpx.Client, flow: str, **body: Any) -> str:
    answer = http.post("/api/workflows", json={"flow": flow, **body})
    assert answer.status_code == 201, answer.text
    workflow_id: str = answer.json()["id"]
    return workflow_id


def listed(http: httpx.Client, limit: int, **params: Any) -> list[str]:
    """Every id the list gives, page after page of ``limit``."""
    ids: list[str] = []
    cursor = None
    for _ in range(50):
        page = http.get("/api/workflows", params={"limit": limit, "cursor": cursor, **params})
        assert page.status_code == 200, page.text
        ids += [item["id"] for item in page.json()["items"]]
        cursor = page.json()["next"]
        if cursor is None:
            return ids
    pytest.fail("the list's pages never ended")


def test_workflows_of_every_partition_are_started_read_listed_and_paged(
    partitioned: Served,
) -> None:
    with partitioned.client() as http:
        finished = [start(http, "A → B") for _ in range(4)]
        held = [start(http, HOLD) for _ in range(5)]
        while len({PARTITIONS.index_of(i) for i in held}) < 2:  # ids are random
            held.append(start(http, HOLD))
        for workflow_id in finished:
            assert wait_state(http, workflow_id, ("finished",))["id"] == workflow_id
            graph = http.get(f"/api/workflows/{workflow_id}/graph").json()
            assert {node["label"] for node in graph["nodes"]} >= {"A", "B"}
            events = http.get(f"/api/workflows/{workflow_id}/history").json()["events"]
            assert events, "a finished workflow has a history"
        for workflow_id in held:
            wait_state(http, workflow_id, ("running",))
        newest_first = list(reversed(finished + held))
        assert [i["id"] for i in http.get("/api/workflows").json()["items"]] == newest_first
        # Pages of 2 over three partitions: each id once, in the same order.
        assert listed(http, 2) == newest_first
        assert listed(http, 2, state="running") == list(reversed(held))
        refused = http.get("/api/workflows", params={"cursor": "1700000000000:w"})
        assert refused.status_code == 400 and "3 partitions" in refused.json()["detail"]


def test_a_workflow_and_a_filter_are_terminated_in_their_partitions(partitioned: Served) -> None:
    with partitioned.client() as http:
        held = [start(http, HOLD) for _ in range(6)]
        while len({PARTITIONS.index_of(i) for i in held[1:]}) < 2:  # ids are random
            held.append(start(http, HOLD))
        for workflow_id in held:
            wait_state(http, workflow_id, ("running",))
        one = held[0]
        stopped = http.post(f"/api/workflows/{one}/terminate", json={"reason": "enough"})
        assert stopped.status_code == 202 and stopped.json()["applied"], stopped.text
        assert wait_state(http, one, ("terminated",))["error"] == "enough"
        bulk = http.post(
            "/api/actions", json={"action": "terminate", "filter": {"state": "running"}}
        )
        assert bulk.status_code == 202, bulk.text
        others = len(held) - 1  # in two partitions at least: the counts are summed
        assert (bulk.json()["matched"], bulk.json()["applied"]) == (others, others)
        for workflow_id in held[1:]:
            wait_state(http, workflow_id, ("terminated",))


def test_a_concurrency_key_places_a_new_id_and_refuses_one_elsewhere(partitioned: Served) -> None:
    key = "tenant-7"
    home = PARTITIONS.index_of_tag(key)
    elsewhere = next(f"w{n}" for n in range(100) if PARTITIONS.index_of(f"w{n}") != home)
    gate = {"concurrency_key": key, "max_running": 1}
    with partitioned.client() as http:
        placed = start(http, HOLD, **gate)
        assert PARTITIONS.index_of(placed) == home
        wait_state(http, placed, ("running",))
        refused = http.post("/api/workflows", json={"flow": HOLD, "id": elsewhere, **gate})
        assert refused.status_code == 400
        assert "lives in that key's partition" in refused.json()["detail"]
        form = {"id": elsewhere, "concurrency_key": key, "max_running": "1"}
        upload = http.post(
            "/api/workflows/upload", files={"file": ("a.flow", HOLD.encode())}, data=form
        )
        assert upload.status_code == 400 and "{tenant-7}" in upload.json()["detail"]
        assert http.get(f"/api/workflows/{elsewhere}").status_code == 404


def test_serve_refuses_a_partition_count_other_than_the_stored_one(
    redis_client: redis.Redis, processes: Processes, tmp_path: Path
) -> None:
    redis_client.set(Keys().partitions, COUNT)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"operate:{OPERATE_TOKEN}\n")
    command = ("serve", "--token-file", str(tokens), "--partitions", "2")
    serve = processes.start("lifecycle", *command, stderr=True)
    assert serve.wait(30) == 2
    assert serve.stderr is not None
    (line,) = serve.stderr.read().decode().strip().splitlines()
    assert "--partitions 2: this deployment is set up for 3 partitions" in line


def test_schedules_status_health_and_metrics_cover_every_partition(
    partitioned: Served,
) -> None:
    with partitioned.client() as http:
        for name in ("nightly", "hourly"):
            added = http.post("/api/schedules", json={"name": name, "flow": "A", "every": "1h"})
            assert added.status_code == 201, added.text
            assert added.json()["first_run"].startswith(f"{{{name}}}@")
            home = PARTITIONS.keys(PARTITIONS.index_of_tag(name))
            assert partitioned.redis.exists(home.schedule(name))
        names = [row["name"] for row in http.get("/api/schedules").json()["items"]]
        assert names == ["hourly", "nightly"]
        paused = http.post("/api/schedules/nightly/pause")
        assert paused.status_code == 202 and paused.json()["changed"]
        (run,) = http.post("/api/schedules/hourly/run-now").json()["runs"]
        assert PARTITIONS.index_of(run) == PARTITIONS.index_of_tag("hourly")
        wait_state(http, run, ("finished",))
        runs = http.get("/api/workflows", params={"schedule": "hourly"}).json()["items"]
        assert run in [item["id"] for item in runs]
        status = http.get("/api/status").json()
        assert [p["prefix"] for p in status["partitions"]] == [k.prefix for k in PARTITIONS.all]
        assert all("warnings" in p for p in status["partitions"])
        assert http.get("/api/health").json() == {"ok": True}
        metrics = http.get("/metrics").text
        for keys in PARTITIONS.all:
            assert f'flowstream_status_up{{partition="{keys.prefix}"}} 1.0' in metrics


class Crashes(EventListener):
    """A task worker whose process() raises: rqse dead-letters the entry at once."""

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        raise RuntimeError("model file missing")


def test_a_dead_letter_in_any_partition_is_listed_and_requeued(partitioned: Served) -> None:
    with partitioned.client() as http:
        # Started until one lands past partition 0: its ml stream holds only that task.
        workflow_id = start(http, "ml:A")
        while PARTITIONS.index_of(workflow_id) == 0:
            workflow_id = start(http, "ml:A")
        wait_state(http, workflow_id, ("running",))
        stream = PARTITIONS.keys_for(workflow_id).tasks("ml")
        pool = redis.ConnectionPool(**partitioned.redis.connection_pool.connection_kwargs)
        worker = Crashes(stream, TASK_GROUP, pool=pool, handle_signals=False, max_deliveries=1)
        worker.listen(idle_timeout=0.5)
        pool.disconnect()
        (letter,) = http.get("/api/dead-letters").json()["items"]
        assert (letter["source"], letter["stream"]) == ("ml", stream)
        before = partitioned.redis.xlen(stream)
        done = http.post("/api/dead-letters/requeue", json={"stream": "ml", "id": letter["id"]})
        assert done.status_code == 200, done.text
        assert done.json()["stream"] == stream and partitioned.redis.xlen(stream) == before + 1
        assert partitioned.redis.xlen(dead_letter_key(stream)) == 0
        again = http.post("/api/dead-letters/requeue", json={"stream": stream, "id": letter["id"]})
        assert again.status_code == 404


def first_data(http: httpx.Client, path: str) -> Any:
    """The data of the first event an event stream sends."""
    with http.stream("GET", path) as events:
        for line in events.iter_lines():
            if line.startswith("data: "):
                return orjson.loads(line[len("data: ") :])
    pytest.fail(f"{path}: no event")


def test_the_event_streams_follow_a_workflow_in_its_partition_and_the_list_in_all(
    partitioned: Served,
) -> None:
    with partitioned.client() as http:
        ids = [start(http, HOLD) for _ in range(3)]
        while len({PARTITIONS.index_of(i) for i in ids}) < 2:  # ids are random
            ids.append(start(http, HOLD))
        for workflow_id in ids:
            wait_state(http, workflow_id, ("running",))
        for workflow_id in ids:
            data = first_data(http, f"/api/workflows/{workflow_id}/stream")
            assert (data["id"], data["state"]) == (workflow_id, "running")
        listing = first_data(http, "/api/workflows/stream")
        assert [item["id"] for item in listing["items"]] == list(reversed(ids))


def test_on_a_redis_cluster_each_partition_is_reached_on_its_master(
    redis_cluster: LocalCluster, cluster_client: RedisCluster
) -> None:
    # On one server any client reaches every key; on a cluster a command sent to the
    # wrong master is refused (MOVED): every route here must find its partition's.
    processes = Processes(redis_cluster.url)
    deployment = Deployment(Connections.open(RedisSettings.resolve(url=redis_cluster.url)))
    server = None
    try:
        cluster = ("--cluster", "--partitions", str(COUNT))
        processes.start("lifecycle", "worker", *cluster, "--consumer", "lc")
        wait_until(lambda: cluster_client.get(Keys().partitions), 20, "the partition count")
        processes.start("workers", "noop", *cluster, "--kinds", "default", "--consumer", "noop")
        config = ApiConfig(deployment.client, Keys(), TOKENS, deployment=deployment)
        server, thread, url = run_server(config)
        with Served(url, deployment.client, Keys()).client() as http:
            ids = [start(http, "A → B") for _ in range(3)]
            while len({PARTITIONS.index_of(i) for i in ids}) < COUNT:  # one in each
                ids.append(start(http, "A → B"))
            held = start(http, HOLD)
            for workflow_id in ids:
                wait_state(http, workflow_id, ("finished",))
                assert http.get(f"/api/workflows/{workflow_id}/graph").status_code == 200
            assert set(listed(http, 2)) == {*ids, held}
            assert first_data(http, f"/api/workflows/{ids[-1]}/stream")["state"] == "finished"
            assert len(first_data(http, "/api/workflows/stream")["items"]) == len(ids) + 1
            stopped = http.post(f"/api/workflows/{held}/terminate")
            assert stopped.status_code == 202, stopped.text
            wait_state(http, held, ("terminated",))
            added = http.post("/api/schedules", json={"name": "n1", "flow": "A", "every": "1h"})
            assert added.status_code == 201, added.text
            assert [row["name"] for row in http.get("/api/schedules").json()["items"]] == ["n1"]
            assert http.get("/api/dead-letters").json() == {"items": []}
            assert len(http.get("/api/status").json()["partitions"]) == COUNT
            assert http.get("/api/health").json() == {"ok": True}
            assert http.get("/metrics").text.count("flowstream_status_up{") == COUNT
    finally:
        if server is not None:
            server.should_exit = True
            thread.join(5)
        processes.stop_all()
        deployment.close()
