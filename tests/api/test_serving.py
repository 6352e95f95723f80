"""How the process serves: the console's files, CORS only when configured, a server
without tokens, and ``demo --serve`` end to end on an embedded Redis."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from flowstream.api.context import ApiConfig
from lifecycle.keys import Keys
from tests.api.conftest import TOKENS, free_port, run_server

Serve = Callable[..., str]  # serve(**ApiConfig fields) -> the server's URL


@pytest.fixture
def serve(redis_client: redis.Redis) -> Iterator[Serve]:
    """Start a server for the test with ``serve(**config)``; stopped at teardown."""
    servers = []

    def start(**config: Any) -> str:
        server, thread, url = run_server(ApiConfig(redis_client, Keys(), **config))
        servers.append((server, thread))
        return url

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(5)


def test_the_console_is_served_at_the_root_beside_the_api_with_a_strict_csp(
    serve: Serve, tmp_path: Path
) -> None:
    (tmp_path / "index.html").write_text("<h1>console</h1>")
    url = serve(tokens=TOKENS, console_dir=tmp_path)
    with httpx.Client(base_url=url) as http:
        page = http.get("/")
        assert page.text == "<h1>console</h1>"
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        assert (
            "frame-ancestors 'none'"
            in http.get("/api/workflows").headers["content-security-policy"]
        )
        assert http.get("/api/workflows").status_code == 401
        missing = http.get("/api/nothing-here")
        assert missing.status_code == 404
        assert missing.headers["content-type"] == "application/problem+json"


def test_cors_answers_only_the_configured_origin(serve: Serve) -> None:
    allowed = "https://ops.example.com"
    preflight = {
        "Origin": allowed,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,x-flowstream",
    }
    closed = serve(tokens=TOKENS)
    with httpx.Client(base_url=closed) as http:
        answer = http.options("/api/workflows", headers=preflight)
        assert "access-control-allow-origin" not in answer.headers
    opened = serve(tokens=TOKENS, cors_origins=(allowed,))
    with httpx.Client(base_url=opened) as http:
        answer = http.options("/api/workflows", headers=preflight)
        assert answer.headers["access-control-allow-origin"] == allowed
        other = http.options(
            "/api/workflows", headers={**preflight, "Origin": "https://evil.example"}
        )
        assert "access-control-allow-origin" not in other.headers


def test_without_tokens_every_request_acts_as_an_operator(serve: Serve) -> None:
    url = serve(tokens=None)
    with httpx.Client(base_url=url) as http:
        assert http.get("/api/session").json() == {"role": "operate", "auth": False}
        assert http.post("/api/workflows", json={"flow": "A"}).status_code == 201


def test_a_bad_query_value_is_a_400_problem(serve: Serve) -> None:
    url = serve(tokens=None)
    with httpx.Client(base_url=url) as http:
        answer = http.get("/api/workflows", params={"limit": 0})
        assert answer.status_code == 400 and "limit" in answer.json()["detail"]
        assert http.get("/api/workflows", params={"state": "sleeping"}).status_code == 400


def test_demo_serve_starts_the_api_and_console_on_an_embedded_redis(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "FLOWSTREAM_"))}
    env["XDG_STATE_HOME"] = str(tmp_path)
    command = [sys.executable, "-m", "lifecycle", "demo", "--serve", "--port", str(port)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        token = None
        deadline = time.monotonic() + 30
        assert proc.stderr is not None
        while token is None and time.monotonic() < deadline:
            line = proc.stderr.readline().decode()
            assert line, "demo --serve ended before it said where it serves"
            found = re.search(r"token made for this run: (\S+)", line)
            token = found[1] if found else None
        assert token, "no token printed"
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            deadline = time.monotonic() + 20
            while True:
                try:
                    answer = http.get("/api/workflows", headers=auth)
                    break
                except httpx.ConnectError:
                    assert time.monotonic() < deadline, "the API never answered"
                    time.sleep(0.1)
            assert answer.status_code == 200
            assert [item["flow"] for item in answer.json()["items"]] == ["demo"]
            assert http.get("/api/workflows").status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
