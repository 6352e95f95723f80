"""A compacted finished workflow over HTTP: the same JSON as the hash compaction used to
leave, in the list too, and a delete that removes it."""

from __future__ import annotations

import time
from typing import Any

import httpx

from lifecycle import compact
from lifecycle import records as rec
from lifecycle.engine.retention import DEFAULT_KEEP_DETAILS, parse_duration, retention_pump
from tests.api.conftest import Served, wait_state


def shown(http: httpx.Client, workflow_id: str) -> dict[str, Any]:
    listed = http.get("/api/workflows", params={"state": "finished"}).json()["items"]
    return {
        "workflow": http.get(f"/api/workflows/{workflow_id}").json(),
        "graph": http.get(f"/api/workflows/{workflow_id}/graph").json(),
        "listed": [item for item in listed if item["id"] == workflow_id],
    }


def test_a_compacted_workflow_reads_as_its_old_hash_did_and_deletes(served: Served) -> None:
    client, keys = served.redis, served.keys
    with served.client() as http:
        started = http.post("/api/workflows", json={"flow": "A → B", "input": {"n": 1}})
        workflow_id = started.json()["id"]
        wait_state(http, workflow_id, ("finished",))
        ended = int(client.hget(keys.workflow(workflow_id), rec.ENDED) or 0)
        keep = int(parse_duration(DEFAULT_KEEP_DETAILS) * 1000)
        assert retention_pump(client, keys).fire_due(ended + keep) >= 1
        assert client.hexists(keys.compacted, workflow_id)
        new = shown(http, workflow_id)
        assert new["workflow"]["state"] == "finished" and new["workflow"]["compacted"]
        assert new["workflow"]["input"] == {"n": 1} and new["listed"][0]["tasks_total"] == 2
        # The form compaction left before: the hash, with its version and salt.
        [fields] = compact.read_compacted(client, keys, [workflow_id])
        packed: Any = client.hget(keys.compacted, workflow_id)
        assert fields is not None
        client.hdel(keys.compacted, workflow_id)
        client.hset(keys.workflow(workflow_id), mapping={**fields, b"v": b"9", b"t": b"00"})
        assert shown(http, workflow_id) == new
        client.delete(keys.workflow(workflow_id))
        client.hset(keys.compacted, workflow_id, packed)  # the new form again
        assert http.delete(f"/api/workflows/{workflow_id}").status_code == 202
        deadline = time.monotonic() + 10
        while http.get(f"/api/workflows/{workflow_id}").status_code != 404:
            assert time.monotonic() < deadline, "still there after its delete"
            time.sleep(0.05)
        assert not client.hexists(keys.compacted, workflow_id)
        assert client.zscore(keys.workflows, workflow_id) is None
