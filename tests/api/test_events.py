"""Server-sent events: a workflow's changes until it ends, the list's changes."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.api.conftest import MAX_STREAMS, OPERATE_TOKEN, Served


def events(lines: list[str]) -> list[tuple[str | None, Any]]:
    found, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            found.append((name, json.loads(line[6:])))
    return found


def test_a_workflow_stream_sends_each_change_and_ends_with_the_workflow(served: Served) -> None:
    with served.client() as http:
        workflow_id = http.post("/api/workflows", json={"flow": "A → B → C"}).json()["id"]
        with http.stream("GET", f"/api/workflows/{workflow_id}/stream") as answer:
            assert answer.headers["content-type"].startswith("text/event-stream")
            received = events(list(answer.iter_lines()))  # ends when the workflow does
    assert {name for name, _ in received} == {"workflow"}
    assert received[-1][1]["state"] == "finished"
    assert len(received) >= 2  # the first state, then changes


def test_a_stream_of_an_unknown_workflow_is_404(served: Served) -> None:
    with served.client() as http:
        assert http.get("/api/workflows/nope/stream").status_code == 404


def test_the_list_stream_sends_the_first_page_and_again_after_a_change(served: Served) -> None:
    with served.client() as http, http.stream("GET", "/api/workflows/stream") as answer:
        lines = answer.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["items"] == []
        http.post("/api/workflows", json={"flow": "A"})
        later = next(line for line in lines if line.startswith("data: "))
        assert len(json.loads(later[6:])["items"]) == 1
        assert http.get("/api/workflows/stream", params={"schedule": "nope"}).status_code == 404


def test_streams_past_the_bound_are_refused_with_503(served: Served) -> None:
    headers = {"Authorization": f"Bearer {OPERATE_TOKEN}"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=5) as http:
        answers, readers = [], []
        try:
            for _ in range(MAX_STREAMS):
                answer = http.send(http.build_request("GET", "/api/workflows/stream"), stream=True)
                answers.append(answer)
                assert answer.status_code == 200
                readers.append(answer.iter_lines())  # kept: a dropped reader closes its stream
                next(readers[-1])  # its generator runs: it is counted
            refused = http.get("/api/workflows/stream")
            assert refused.status_code == 503
        finally:
            for answer in answers:
                answer.close()
