"""Schedules and kind limits over HTTP: the same functions as ``python -m lifecycle
schedule`` and ``limit``."""

from __future__ import annotations

from tests.api.conftest import READ_TOKEN, Served

NIGHTLY = {"name": "nightly", "flow": "@flow night\nA → B\n", "cron": "0 2 * * *"}


def test_a_schedule_is_added_listed_paused_resumed_run_now_and_removed(served: Served) -> None:
    with served.client() as http:
        added = http.post("/api/schedules", json={**NIGHTLY, "input": {"n": 1}, "priority": 2})
        assert added.status_code == 201, added.text
        assert added.json()["first_run"].startswith("nightly@")
        assert http.post("/api/schedules", json=NIGHTLY).status_code == 409
        [row] = http.get("/api/schedules").json()["items"]
        assert (row["name"], row["flow"], row["priority"], row["paused"]) == (
            "nightly",
            "night",
            2,
            False,
        )
        paused = http.post("/api/schedules/nightly/pause")
        assert paused.status_code == 202 and paused.json()["changed"] is True
        assert http.get("/api/schedules").json()["items"][0]["paused"] is True
        assert http.post("/api/schedules/nightly/resume").json()["next_run"].startswith("nightly@")
        [run] = http.post("/api/schedules/nightly/run-now").json()["runs"]
        assert run.startswith("nightly@")
        assert http.delete("/api/schedules/nightly").json() == {"name": "nightly", "removed": True}
        assert http.delete("/api/schedules/nightly").status_code == 404
        assert http.post("/api/schedules/nightly/pause").status_code == 404


def test_a_bad_schedule_is_a_400_that_says_where_and_a_read_token_cannot_add_one(
    served: Served,
) -> None:
    with served.client() as http:
        broken = http.post("/api/schedules", json={**NIGHTLY, "flow": "@flow x\nA → → B\n"})
        assert broken.status_code == 400 and broken.json()["line"] == 2
        cron = http.post("/api/schedules", json={**NIGHTLY, "cron": "0 25 * * *"})
        assert cron.status_code == 400 and "--cron '0 25 * * *'" in cron.json()["detail"]
        both = http.post("/api/schedules", json={**NIGHTLY, "every": "1m"})
        assert both.status_code == 400 and "one of --cron and --every" in both.json()["detail"]
        assert http.get("/api/schedules").json()["items"] == []
    with served.client(READ_TOKEN) as http:
        assert http.post("/api/schedules", json=NIGHTLY).status_code == 403
        assert http.get("/api/schedules").status_code == 200


def test_a_kind_limit_is_set_listed_and_removed(served: Served) -> None:
    with served.client() as http:
        assert http.put("/api/limits/ml", json={"limit": 2}).json() == {"kind": "ml", "limit": 2}
        assert http.get("/api/limits").json()["items"] == [
            {"kind": "ml", "limit": 2, "running": 0, "waiting": 0}
        ]
        refused = http.put("/api/limits/ml", json={"limit": 0})
        assert refused.status_code == 400 and "from 1 to" in refused.json()["detail"]
        assert http.put("/api/limits/ml", json={"limit": True}).status_code == 400
        assert http.delete("/api/limits/ml").json() == {"kind": "ml", "removed": True}
        assert http.delete("/api/limits/ml").status_code == 404
        assert http.get("/api/limits").json()["items"] == []
    with served.client(READ_TOKEN) as http:
        assert http.put("/api/limits/ml", json={"limit": 2}).status_code == 403
