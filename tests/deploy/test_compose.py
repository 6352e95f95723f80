"""deploy/compose.yaml and make-secrets.sh: the file checked, then its services run as
processes under the Redis users the script writes, with their health checks."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from lifecycle.keys import Keys
from rqse.server import RedisServer, free_port
from tests.deploy.deploy_files import (
    DEPLOY,
    ROOT,
    compose_file,
)


def test_every_compose_service_has_a_health_check_and_a_restart_policy() -> None:
    services = compose_file()["services"]
    assert {"redis", "lifecycle", "receipts", "resource", "shop", "api"} <= set(services)
    for name, service in services.items():
        assert service.get("restart") in ("always", "unless-stopped", "on-failure"), name
        test = service["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name


def test_compose_redis_has_aof_everysec_and_noeviction() -> None:
    command = " ".join(compose_file()["services"]["redis"]["command"])
    for setting in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"):
        assert setting in command


def test_compose_runs_two_lifecycle_workers_and_keeps_the_archive_on_a_volume() -> None:
    compose = compose_file()
    services = compose["services"]
    assert services["lifecycle"]["deploy"]["replicas"] == 2
    command = services["receipts"]["command"]
    archive = command[command.index("--archive") + 1]
    volume, _, path = services["receipts"]["volumes"][0].partition(":")
    assert path == archive and volume in compose["volumes"]


def test_compose_has_no_inline_secrets() -> None:
    compose = compose_file()
    for name, service in compose["services"].items():
        for key, value in (service.get("environment") or {}).items():
            assert not re.search(r"PASSWORD|TOKEN|SECRET", key), (name, key)
            assert key.endswith("_FILE") or "://" not in str(value), (name, key)
        assert "@" not in " ".join(map(str, service.get("command") or [])), name
    for name, secret in compose["secrets"].items():
        assert set(secret) == {"file"} and secret["file"].startswith("./secrets/"), name
    assert "secrets/" in (DEPLOY / ".gitignore").read_text()


SECURITY = ROOT / "docs" / "security.md"
# The users make-secrets.sh writes: the lines of docs/security.md they are made of
# (the base line and its add-ons: the lifecycle worker's for serving wait:, the task
# user's for Task.cancelled(), which the example calls), <kind> replaced by `shop`.
ACL_USERS = {
    "flowstream-lifecycle": ["flowstream-lifecycle"],
    "flowstream-receipts": ["flowstream-receipts"],
    "flowstream-resource": ["flowstream-resource"],
    "flowstream-shop": ["flowstream-tasks-<kind>"],
    "flowstream-reader": ["flowstream-reader"],
}


def _documented_rules(user: str) -> list[str]:
    rules = []
    for line in SECURITY.read_text(encoding="utf-8").splitlines():
        words = line.split()
        if line.startswith("ACL SETUSER ") and words[2] in ACL_USERS[user]:
            rules += [w for w in words[3:] if w not in ("reset", "on", ">PASSWORD")]
    return [r.replace("<kind>", "shop") for r in rules]


@pytest.fixture(scope="module")
def made_secrets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/ copied and make-secrets.sh run in the copy: its secrets/ directory."""
    copy = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY, copy, ignore=shutil.ignore_patterns("secrets"))
    made = subprocess.run(["sh", str(copy / "make-secrets.sh")], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    return copy / "secrets"


@pytest.fixture(scope="module")
def acl_server(made_secrets: Path) -> Iterator[RedisServer]:
    """A private server with the ACL file make-secrets.sh wrote, as compose runs Redis."""
    server = RedisServer(extra_args=["--aclfile", str(made_secrets / "redis.acl")]).start()
    try:
        yield server
    finally:
        server.stop()


def _url(secrets: Path, name: str, server: RedisServer) -> str:
    url = (secrets / f"redis-url-{name}").read_text().strip()
    return url.replace("@redis:6379", f"@127.0.0.1:{server.port}")


def test_make_secrets_writes_the_documented_users_and_keeps_what_exists(
    made_secrets: Path,
) -> None:
    assert stat.S_IMODE(made_secrets.stat().st_mode) == 0o700
    before = {p.name: p.read_text() for p in made_secrets.iterdir()}
    made = subprocess.run(["sh", str(made_secrets.parent / "make-secrets.sh")], capture_output=True)
    assert made.returncode == 0
    assert {p.name: p.read_text() for p in made_secrets.iterdir()} == before
    users = {}
    for line in (made_secrets / "redis.acl").read_text().splitlines():
        words = line.split()
        users[words[1]] = [w for w in words[2:] if w != "on" and not w.startswith(">")]
    assert users.pop("default") == ["nopass", "resetchannels", "-@all", "+ping"]
    assert users.pop("flowstream-admin") == ["~*", "&*", "+@all"]
    for user, rules in users.items():
        assert rules == _documented_rules(user), user
    assert set(users) == set(ACL_USERS)
    reader = (made_secrets / "redis-url-reader").read_text()
    assert f":{(made_secrets / 'redis-password-reader').read_text()}@" in reader
    tokens = (made_secrets / "api-tokens").read_text().split()
    assert tokens[0] == "read:" + (made_secrets / "api-read-token").read_text().strip()


def test_the_acl_file_opens_only_ping_to_anyone_and_each_url_logs_in(
    made_secrets: Path, acl_server: RedisServer
) -> None:
    anonymous = redis.Redis(port=acl_server.port)
    assert anonymous.ping()
    with pytest.raises(redis.exceptions.NoPermissionError):
        anonymous.get("x")
    for name in ("lifecycle", "receipts", "resource", "shop", "reader", "admin"):
        client = redis.Redis.from_url(_url(made_secrets, name, acl_server))
        assert client.ping()  # the connection authenticated (AUTH user password) first
        client.close()
    with pytest.raises(redis.exceptions.AuthenticationError):
        wrong = re.sub(r":[0-9a-f]+@", ":wrong@", _url(made_secrets, "shop", acl_server))
        redis.Redis.from_url(wrong).ping()


def test_the_compose_services_run_under_their_users_and_their_health_checks_pass(
    tmp_path: Path, made_secrets: Path, acl_server: RedisServer
) -> None:
    """Each service's command run as a process as compose would (its REDIS_URL_FILE,
    the secrets as files), its health check run beside it (same host name), against a
    server with the generated ACL file: each check fails before its worker starts and
    passes once it runs; the shop worker is checked alone, before any flow used its
    kind; then the tutorial's flow runs through every worker, submitted as admin, and
    the server refused nothing."""
    admin = redis.Redis.from_url(_url(made_secrets, "admin", acl_server))
    admin.flushdb()
    admin.acl_log_reset()
    run_secrets = tmp_path / "run-secrets"
    run_secrets.mkdir()
    for name in ("lifecycle", "receipts", "resource", "shop", "reader", "admin"):
        (run_secrets / f"redis-url-{name}").write_text(_url(made_secrets, name, acl_server))
    services = compose_file()["services"]

    def local(argv: list[Any]) -> list[str]:
        """Container paths made paths of this test."""
        out = []
        for arg in map(str, argv):
            arg = arg.replace("/run/secrets/", f"{run_secrets}/")
            out.append(str(tmp_path / "data") if arg.startswith("/var/lib/") else arg)
        return out

    def env(service: str) -> dict[str, str]:
        given = services[service]["environment"]
        return {**os.environ, **{k: local([v])[0] for k, v in given.items()}}

    def health(service: str) -> subprocess.CompletedProcess[str]:
        test = local(services[service]["healthcheck"]["test"])
        assert test[:3] == ["CMD", "python", "-m"], test
        return subprocess.run(
            [sys.executable, "-m", *test[3:]], env=env(service), capture_output=True, text=True
        )

    ports: dict[str, int] = {}

    def start(service: str) -> subprocess.Popen[bytes]:
        """The service's command, its metrics on a port of its own on loopback (every
        container has 9100 to itself)."""
        program, *argv = local(services[service]["command"])
        ports[service] = free_port()
        argv[argv.index("--metrics-port") + 1] = str(ports[service])
        argv[argv.index("--metrics-host") + 1] = "127.0.0.1"
        return subprocess.Popen([sys.executable, "-m", program, *argv], env=env(service), cwd=ROOT)

    def healthy(service: str) -> str:
        deadline = time.monotonic() + 20
        while (check := health(service)).returncode != 0:
            assert time.monotonic() < deadline, f"{service}: {check.stdout}{check.stderr}"
            time.sleep(0.3)
        return check.stdout

    running = []
    try:
        assert health("shop").returncode == 1
        running.append(start("shop"))
        out = healthy("shop")
        assert out.startswith(f"alive: consumer {socket.gethostname()}-")
        assert f"on {Keys().tasks('shop')} read " in out
        assert not admin.sismember(Keys().kinds, "shop")
        assert health("receipts").returncode == 1
        for service in ("lifecycle", "receipts", "resource"):
            running.append(start(service))
        for service in ("lifecycle", "receipts", "resource"):
            healthy(service)
        flow = subprocess.run(
            [sys.executable, "-m", "lifecycle", "run", "examples/tutorial/shop.flow", "--wait"],
            env=env("api"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert flow.returncode == 0, flow.stdout + flow.stderr
        assert '"total"' in flow.stdout
        for service, port in ports.items():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
                assert b"flowstream_redis_round_trips_total" in page.read(), service
    finally:
        for process in running:
            process.terminate()
        for process in running:
            process.wait(timeout=30)
    refused = [
        f"{e.get('username')}: {e.get('reason')} {e.get('object')}"
        for e in admin.acl_log()
        if e.get("object") != "config|get"  # no documented line grants it (security.md)
    ]
    assert refused == []
