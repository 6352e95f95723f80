"""Starting, reading and controlling workflows over HTTP, against a real Redis and
real workers."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from flowstream.cli import main
from tests.api.conftest import Served, wait_state

FLOW = "A → B|C → D"


def test_a_started_flow_runs_to_its_end_and_reads_as_inspect_shows_it(served: Served) -> None:
    with served.client() as http:
        started = http.post("/api/workflows", json={"flow": FLOW, "input": {"n": 1}})
        assert started.status_code == 201, started.text
        workflow_id = started.json()["id"]
        data = wait_state(http, workflow_id, ("finished",))
        assert data["id"] == workflow_id and data["input"] == {"n": 1}
        assert data["created"].endswith("+00:00") and data["ended"] is not None
        assert {n["name"] for n in data["nodes"]} == {"A", "B", "C", "D"}
        assert all(n["state"] == "ended" and n["attempt"] == 1 for n in data["nodes"])
        listed = http.get("/api/workflows", params={"state": "finished"}).json()
        assert [(i["id"], i["tasks_ended"], i["tasks_total"]) for i in listed["items"]] == [
            (workflow_id, 4, 4)
        ]
        assert listed["next"] is None
        graph = http.get(f"/api/workflows/{workflow_id}/graph").json()
        states = {n["label"]: n["state"] for n in graph["nodes"] if n["kind"] == "task"}
        assert states == {"A": "ended", "B": "ended", "C": "ended", "D": "ended"}
        ids = {n["label"]: n["id"] for n in graph["nodes"]}
        following = {e["to"] for e in graph["edges"] if e["from"] == ids["A"]}
        assert following and ids["D"] not in following  # A leads on, not straight to D
        events = http.get(f"/api/workflows/{workflow_id}/history").json()["events"]
        assert events and events[0]["event"] == "start-workflow"


def test_a_syntax_error_is_a_400_problem_with_line_and_column(served: Served) -> None:
    with served.client() as http:
        for path in ("/api/workflows", "/api/flows/check"):
            answer = http.post(path, json={"flow": "A → B\nC → → D"})
            assert answer.status_code == 400
            assert answer.headers["content-type"] == "application/problem+json"
            problem = answer.json()
            assert (problem["status"], problem["line"]) == (400, 2)
            assert problem["column"] >= 1 and "2:" in problem["detail"]


def test_check_counts_the_nodes_and_names_the_task_kinds(served: Served) -> None:
    with served.client() as http:
        answer = http.post("/api/flows/check", json={"flow": "A → mail:send"})
        assert answer.status_code == 200
        assert answer.json()["ok"] is True and answer.json()["kinds"] == ["default", "mail"]


def test_an_unknown_id_is_404_and_a_refused_action_409(served: Served) -> None:
    with served.client() as http:
        assert http.get("/api/workflows/nope").status_code == 404
        assert http.post("/api/workflows/nope/pause").status_code == 404
        workflow_id = http.post("/api/workflows", json={"flow": "A"}).json()["id"]
        wait_state(http, workflow_id, ("finished",))
        refused = http.post(f"/api/workflows/{workflow_id}/pause")
        assert refused.status_code == 409, refused.text
        assert "finished" in refused.json()["detail"]
        assert http.delete(f"/api/workflows/{workflow_id}").status_code == 202


def test_a_taken_id_is_409_and_an_id_no_route_could_name_is_400(served: Served) -> None:
    with served.client() as http:
        assert http.post("/api/workflows", json={"flow": "A", "id": "w1"}).status_code == 201
        again = http.post("/api/workflows", json={"flow": "A", "id": "w1"})
        assert again.status_code == 409
        for bad in ("", "a/b", "tab\there", "x" * 201, "stream", ".", ".."):
            assert http.post("/api/workflows", json={"flow": "A", "id": bad}).status_code == 400


def test_terminate_while_tasks_end_never_answers_500(served: Served) -> None:
    wide = "A → " + "|".join(f"T{i}" for i in range(12)) + " → Z"
    with served.client() as http:
        ids = [http.post("/api/workflows", json={"flow": wide}).json()["id"] for _ in range(6)]
        codes = []
        for workflow_id in ids:
            for action in ("terminate", "restart", "terminate"):
                codes.append(http.post(f"/api/workflows/{workflow_id}/{action}").status_code)
            codes.append(http.get(f"/api/workflows/{workflow_id}/graph").status_code)
        assert set(codes) <= {200, 202, 409}, codes
        for workflow_id in ids:
            wait_state(http, workflow_id, ("terminated", "finished", "failed"))


def test_a_bulk_action_by_filter_pauses_every_running_workflow_of_a_flow(served: Served) -> None:
    slow = "@flow slow\nA → B → C → D → E → F"
    with served.client() as http:
        ids = [http.post("/api/workflows", json={"flow": slow}).json()["id"] for _ in range(5)]
        answer = http.post(
            "/api/actions", json={"action": "pause", "filter": {"flow": "slow", "state": "running"}}
        )
        assert answer.status_code == 202, answer.text
        body = answer.json()
        assert body["matched"] + body["refused"] <= 5 and body["applied"] >= 1
        unfiltered = http.post("/api/actions", json={"action": "delete", "filter": {}})
        assert unfiltered.status_code == 400
        http.post("/api/actions", json={"action": "terminate", "filter": {"flow": "slow"}})
        for workflow_id in ids:
            wait_state(http, workflow_id, ("terminated", "finished"))


def test_the_list_pages_by_cursor_without_repeating_a_workflow(served: Served) -> None:
    with served.client() as http:
        ids = {http.post("/api/workflows", json={"flow": "A"}).json()["id"] for _ in range(7)}
        for workflow_id in ids:  # listed once the lifecycle has applied its start
            wait_state(http, workflow_id, ("finished",))
        seen: list[str] = []
        cursor = None
        while True:
            params: dict[str, str | int] = {"limit": 3}
            if cursor:
                params["cursor"] = cursor
            page = http.get("/api/workflows", params=params).json()
            seen += [item["id"] for item in page["items"]]
            cursor = page["next"]
            if cursor is None:
                break
        assert sorted(seen) == sorted(ids) and len(seen) == 7
        assert http.get("/api/workflows", params={"cursor": "nonsense"}).status_code == 400


def test_an_upload_starts_the_flow_and_bad_uploads_are_refused(served: Served) -> None:
    with served.client() as http:
        good = http.post(
            "/api/workflows/upload",
            files={"file": ("x.flow", b"A \xe2\x86\x92 B", "text/plain")},
            data={"input": '{"k": 2}'},
        )
        assert good.status_code == 201, good.text
        assert wait_state(http, good.json()["id"], ("finished",))["input"] == {"k": 2}
        latin = http.post("/api/workflows/upload", files={"file": ("x.flow", b"A \xe9 B")})
        assert latin.status_code == 400 and "UTF-8" in latin.json()["detail"]
        broken = http.post("/api/workflows/upload", files={"file": ("x.flow", b"A ->\n-> B")})
        assert broken.status_code == 400 and broken.json()["line"] >= 1
        big = http.post(
            "/api/workflows/upload", files={"file": ("x.flow", b"A" * (1024 * 1024 + 10))}
        )
        assert big.status_code == 413
        bad_input = http.post(
            "/api/workflows/upload", files={"file": ("x.flow", b"A")}, data={"input": "{"}
        )
        assert bad_input.status_code == 400


def test_a_body_past_the_limit_is_413_before_it_is_read(served: Served) -> None:
    with served.client() as http:
        huge = b'{"flow": "' + b"A" * (10 * 1024 * 1024) + b'"}'
        answer = http.post(
            "/api/workflows", content=huge, headers={"Content-Type": "application/json"}
        )
        assert answer.status_code == 413


def test_status_and_dead_letters_answer_as_the_cli(served: Served) -> None:
    with served.client() as http:
        status = http.get("/api/status")
        assert status.status_code == 200 and "warnings" in status.json()
        assert http.get("/api/dead-letters").json() == {"items": []}
        missing = http.post("/api/dead-letters/requeue", json={"id": "1-1"})
        assert missing.status_code == 404


def test_openapi_metrics_and_docs_are_served(served: Served) -> None:
    with httpx.Client(base_url=served.url) as http:
        assert "/api/workflows" in http.get("/openapi.json").json()["paths"]
        metrics = http.get("/metrics")
        assert metrics.status_code == 200 and "flowstream_status_up 1.0" in metrics.text
        docs = http.get("/docs").text
        assert "/api/workflows" in docs and "<script" not in docs


def test_a_bulk_action_older_than_selects_by_creation_time(served: Served) -> None:
    slow = "@flow aged\nA → B → C → D → E → F → G → H"
    with served.client() as http:
        ids = [http.post("/api/workflows", json={"flow": slow}).json()["id"] for _ in range(3)]
        recent = {"action": "pause", "filter": {"flow": "aged", "older_than": "1h"}}
        assert http.post("/api/actions", json=recent).json()["matched"] == 0
        bad = {"action": "pause", "filter": {"older_than": "soon"}}
        assert http.post("/api/actions", json=bad).status_code == 400
        every = {"action": "terminate", "filter": {"flow": "aged", "older_than": 0}}
        answer = http.post("/api/actions", json=every).json()
        assert answer["matched"] == 3 and answer["applied"] + answer["already"] <= 3
        for workflow_id in ids:
            wait_state(http, workflow_id, ("terminated", "finished"))


def test_a_start_carries_its_priority_and_refuses_one_out_of_range(served: Served) -> None:
    with served.client() as http:
        started = http.post("/api/workflows", json={"flow": "A", "priority": 3})
        assert started.status_code == 201
        assert http.get(f"/api/workflows/{started.json()['id']}").json()["priority"] == 3
        refused = http.post("/api/workflows", json={"flow": "A", "priority": 42})
        assert refused.status_code == 400 and "42" in refused.json()["detail"]
        boolean = http.post("/api/workflows", json={"flow": "A", "priority": True})
        assert boolean.status_code == 400 and "priority" in boolean.json()["detail"]


def test_a_schedules_runs_are_listed_and_acted_on_by_its_name(
    served: Served, redis_url: str, tmp_path: Path
) -> None:
    flow = tmp_path / "tick.flow"
    flow.write_text("A")
    add = ["schedule", "add", "tick", str(flow), "--every", "1s", "--redis-url", redis_url]
    assert main(add) == 0
    with served.client() as http:
        http.post("/api/workflows", json={"flow": "A"})  # a run of no schedule
        deadline = time.monotonic() + 10
        while not (runs := http.get("/api/workflows", params={"schedule": "tick"}).json()["items"]):
            assert time.monotonic() < deadline, "the schedule started no run"
            time.sleep(0.1)
        assert all(run["id"].startswith("tick") for run in runs)
        assert http.get("/api/workflows", params={"schedule": "nope"}).status_code == 404
        bulk = {"action": "delete", "filter": {"schedule": "tick", "state": "finished"}}
        assert http.post("/api/actions", json=bulk).status_code == 202
        missing = {"action": "delete", "filter": {"schedule": "nope"}}
        assert http.post("/api/actions", json=missing).status_code == 404
    assert main(["schedule", "remove", "tick", "--redis-url", redis_url]) == 0


def test_a_corrupt_record_is_shown_with_its_problems_never_a_500(served: Served) -> None:
    with served.client() as http:
        http.post("/api/workflows", json={"flow": "A → B", "id": "bad"})
        wait_state(http, "bad", ("finished",))
        served.redis.hset(served.keys.workflow("bad"), mapping={"s": b"{oops", "o:1": b"[1"})
        for path in ("", "/graph", "/history"):
            assert http.get(f"/api/workflows/bad{path}").status_code == 200, path
        data = http.get("/api/workflows/bad").json()
        assert data["state"] == "corrupt" and any("field s" in p for p in data["corrupt"])
        listed = http.get("/api/workflows").json()["items"]
        assert [item["state"] for item in listed] == ["corrupt"]
