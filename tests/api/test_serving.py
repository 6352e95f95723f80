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
from tests.api.conftest import OPERATE_TOKEN, TOKENS, free_port, run_server

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
    with httpx.Client(base_url=url, headers={"X-Flowstream": "1"}) as http:
        assert http.get("/api/session").json() == {"role": "operate", "auth": False}
        assert http.post("/api/workflows", json={"flow": "A"}).status_code == 201


def test_without_tokens_no_page_of_another_site_can_change_or_read_anything(
    serve: Serve, redis_client: redis.Redis
) -> None:
    url = serve(tokens=None)
    port = url.rpartition(":")[2]
    with httpx.Client(base_url=url) as http:
        # What a page of any site can send without a CORS preflight: no custom header.
        forged = http.post("/api/workflows", content=b'{"flow": "@flow pwned\nsteal"}')
        assert forged.status_code == 403 and "X-Flowstream" in forged.json()["detail"]
        bulk = {"action": "delete", "filter": {"older_than": 0}}
        assert http.post("/api/actions", json=bulk).status_code == 403
        # DNS rebinding: the browser's Host is the attacker's name for this address.
        rebound = http.get("/api/workflows", headers={"Host": f"evil.example:{port}"})
        assert rebound.status_code == 403 and "loopback" in rebound.json()["detail"]
        assert http.get("/api/workflows", headers={"Host": f"localhost:{port}"}).status_code == 200
    assert redis_client.xlen(Keys().lifecycle) == 0  # nothing was started


def test_no_body_is_read_from_a_caller_without_a_token_nor_past_the_limit(serve: Serve) -> None:
    url = serve(tokens=TOKENS)

    def chunks(total: int) -> Iterator[bytes]:
        for _ in range(total // 65536):
            yield b"x" * 65536

    with httpx.Client(base_url=url, timeout=30) as http:
        # A chunked body declares no length: without a token it is refused before it is read.
        answer = http.post("/api/workflows/upload", content=chunks(64 << 20))
        assert answer.status_code == 401
        # With a token it is counted as it arrives, and refused past the limit.
        operate = {"Authorization": f"Bearer {OPERATE_TOKEN}"}
        big = http.post("/api/workflows", content=chunks(64 << 20), headers=operate)
        assert big.status_code == 413
        # The login takes a token, not megabytes.
        login = http.post("/api/session", content=b"x" * 10_000)
        assert login.status_code == 413


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


def test_health_needs_no_token_and_is_503_while_redis_does_not_answer(serve: Serve) -> None:
    url = serve(tokens=TOKENS)
    assert httpx.get(url + "/api/health").json() == {"ok": True}
    assert httpx.get(url + "/api/status").status_code == 401  # the rest still asks a token
    closed = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    server, thread, down = run_server(ApiConfig(closed, Keys(), TOKENS))
    try:
        answer = httpx.get(down + "/api/health", timeout=10)
        assert answer.status_code == 503
        assert answer.headers["content-type"] == "application/problem+json"
    finally:
        server.should_exit = True
        thread.join(5)
