"""Who may do what: bearer tokens by role, the console's cookie with its CSRF header,
and a server without tokens only on a loopback address."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from flowstream.api.auth import COOKIE, TokenError, Tokens
from flowstream.api.serve import load_tokens
from flowstream.cli import main
from tests.api.conftest import OPERATE_TOKEN, READ_TOKEN, Served, wait_state


def test_no_token_or_a_bad_one_is_401(served: Served) -> None:
    with served.client(token=None) as http:
        answer = http.get("/api/workflows")
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"] == "Bearer"
        assert answer.headers["content-type"] == "application/problem+json"
    with served.client(token="not-a-token-we-know-at-all") as http:
        assert http.get("/api/workflows").status_code == 401
        assert http.post("/api/workflows", json={"flow": "A"}).status_code == 401
    with served.client(token=None, headers={"Authorization": "Basic eDp5"}) as http:
        assert http.get("/api/status").status_code == 401


def test_a_read_token_reads_but_every_action_is_403(served: Served) -> None:
    with served.client(OPERATE_TOKEN) as operator:
        workflow_id = operator.post("/api/workflows", json={"flow": "A"}).json()["id"]
    with served.client(READ_TOKEN) as reader:
        assert reader.get("/api/workflows").status_code == 200
        assert reader.get(f"/api/workflows/{workflow_id}").status_code == 200
        assert reader.post("/api/workflows", json={"flow": "A"}).status_code == 403
        assert reader.post(f"/api/workflows/{workflow_id}/terminate").status_code == 403
        assert reader.delete(f"/api/workflows/{workflow_id}").status_code == 403
        bulk = {"action": "terminate", "filter": {"state": "running"}}
        assert reader.post("/api/actions", json=bulk).status_code == 403
        assert reader.post("/api/dead-letters/requeue", json={"id": "1-1"}).status_code == 403
        assert reader.get("/api/session").json() == {"role": "read", "auth": True}


def test_the_session_cookie_authenticates_and_changes_need_the_csrf_header(
    served: Served,
) -> None:
    with served.client(token=None) as http:
        assert (
            http.post("/api/session", json={"token": "wrong-token-wrong-token"}).status_code == 401
        )
        login = http.post("/api/session", json={"token": OPERATE_TOKEN})
        assert login.status_code == 204
        cookie = login.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie
        assert "SameSite=strict" in cookie and "Path=/" in cookie
        assert http.get("/api/session").json()["role"] == "operate"
        assert http.get("/api/workflows").status_code == 200
        refused = http.post("/api/workflows", json={"flow": "A"})
        assert refused.status_code == 403 and "X-Flowstream" in refused.json()["detail"]
        started = http.post("/api/workflows", json={"flow": "A"}, headers={"X-Flowstream": "1"})
        assert started.status_code == 201
        assert http.delete("/api/session").status_code == 204
        assert http.get("/api/workflows").status_code == 401


def test_gets_never_change_state(served: Served) -> None:
    with served.client() as http:
        http.post("/api/workflows", json={"flow": "A", "id": "w"})
        wait_state(http, "w", ("finished",))
        record = served.keys.workflow("w")
        before = served.redis.xlen(served.keys.lifecycle), served.redis.hget(record, "v")
        for path in ("/api/workflows", "/api/workflows/w", "/api/status", "/api/dead-letters"):
            assert http.get(path).status_code == 200
        after = served.redis.xlen(served.keys.lifecycle), served.redis.hget(record, "v")
        assert after == before
        assert http.get("/api/workflows/w/terminate").status_code == 405


def test_a_token_file_line_without_a_role_or_too_short_is_refused() -> None:
    with pytest.raises(TokenError, match="line 2: expected ROLE:TOKEN"):
        Tokens.parse("read:0123456789abcdef\nadmin:0123456789abcdef\n", "tokens")
    with pytest.raises(TokenError, match="at least 16"):
        Tokens.parse("operate:short", "tokens")
    with pytest.raises(TokenError, match="printable ASCII"):  # no HTTP header could carry it
        Tokens.parse("read:ÄÖÜäöüßéèêëàâ€€€€", "tokens")
    assert Tokens.parse("# ops\noperate:0123456789abcdef", "t").role("0123456789abcdef") == (
        "operate"
    )


def test_serve_without_auth_refuses_an_address_other_hosts_reach(
    capsys: pytest.CaptureFixture[str], redis_url: str
) -> None:
    code = main(["serve", "--no-auth", "--host", "0.0.0.0", "--redis-url", redis_url])
    err = capsys.readouterr().err
    assert code == 2 and "--no-auth with --host 0.0.0.0: refused" in err
    assert "Traceback" not in err


def test_serve_without_tokens_says_how_to_give_them(
    capsys: pytest.CaptureFixture[str], redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLOWSTREAM_API_TOKENS", raising=False)
    assert main(["serve", "--redis-url", redis_url]) == 2
    assert "no API tokens: --token-file FILE or FLOWSTREAM_API_TOKENS" in capsys.readouterr().err


def test_serve_without_the_api_extra_says_which_install_it_needs(
    capsys: pytest.CaptureFixture[str], redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if not installed
    assert main(["serve", "--no-auth", "--redis-url", redis_url]) == 2
    assert "pip install 'flowstream[api]'" in capsys.readouterr().err


def test_no_auth_on_loopback_is_allowed_and_says_so_loudly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for host in ("127.0.0.1", "::1", "localhost"):
        args = argparse.Namespace(no_auth=True, host=host, token_file=None)
        assert load_tokens(args) is None
        assert "WARNING: --no-auth" in capsys.readouterr().err


def test_the_program_runs_without_the_api_extra() -> None:
    # Every other command is usable where FastAPI and uvicorn are not installed.
    code = (
        "import sys\n"
        "for name in ('fastapi', 'uvicorn', 'starlette', 'python_multipart'):\n"
        "    sys.modules[name] = None\n"
        "from flowstream.cli import main\n"
        "sys.exit(main(['inspect', '--help']))\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert "usage: python -m lifecycle inspect" in ran.stdout


def test_tokens_come_from_the_file_else_the_variable_separated_by_commas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWSTREAM_API_TOKENS", "operate:aaaaaaaaaaaaaaaa, read:bbbbbbbbbbbbbbbb")
    from_env = Tokens.load(None)
    assert from_env is not None
    assert (from_env.role("aaaaaaaaaaaaaaaa"), from_env.role("bbbbbbbbbbbbbbbb")) == (
        "operate",
        "read",
    )
    file = tmp_path / "tokens"
    file.write_text("read:cccccccccccccccc,dd\n")  # a comma belongs to a file's token
    from_file = Tokens.load(str(file))
    assert from_file is not None and from_file.role("cccccccccccccccc,dd") == "read"
    assert from_file.role("aaaaaaaaaaaaaaaa") is None
    with pytest.raises(TokenError, match="cannot read"):
        Tokens.load(str(tmp_path / "missing"))
