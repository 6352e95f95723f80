"""The Redis ACL lines of docs/security.md, checked for real.

A private server gets the users exactly as the document writes them (the
``default`` user off), every component runs as a subprocess under its own
user, and workflows go through every path those users must allow: resource
source and sink, two task kinds, ``wait:delay``, latches, ``wait:event``, a
retried failure, a timeout, a forged answer and a malformed start-task. The
server's ACL log must stay empty.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle.keys import Keys
from lifecycle.kind_limits import set_kind_limit
from lifecycle.submit import start_workflow
from rqse import EventClient, message
from rqse.server import RedisServer
from workers.task import Task, TaskListener

ROOT = Path(__file__).resolve().parent.parent
SECURITY = ROOT / "docs" / "security.md"
KINDS = ("default", "k")  # the kinds given a flowstream-tasks-<kind> user
CANCEL_KIND = "k"  # whose tasks call Task.cancelled(): it gets the extra grant


class Step(TaskListener):
    """Kind ``k``: ``k:fail`` fails, ``k:slow`` outlives its timeout, others echo
    the input (and ``check: true`` asks whether the attempt is cancelled)."""

    kind = "k"

    def run(self, task: Task) -> Any:
        if task.operation == "fail":
            raise RuntimeError("asked to fail")
        if task.operation == "slow":
            time.sleep(1.5)
        cancelled = task.cancelled() if task.parameters.get("check") else None
        return {"seen": task.input, "cancelled": cancelled}


def acl_blocks() -> list[list[str]]:
    """The ``ACL SETUSER`` lines of each fenced block of docs/security.md."""
    blocks = re.findall(r"```text\n(.*?)```", SECURITY.read_text(encoding="utf-8"), flags=re.S)
    found = [
        [line for line in block.splitlines() if line.startswith("ACL SETUSER flowstream-")]
        for block in blocks
    ]
    return [lines for lines in found if lines]


def user_commands(line: str, password: str) -> Iterator[tuple[str, list[str]]]:
    """(user, ACL SETUSER arguments) for one documented line; ``<kind>`` lines
    for each kind this test runs (the extra grant only for the cancelling kind)."""
    words = shlex.split(line)
    kinds = (KINDS if ">PASSWORD" in words else (CANCEL_KIND,)) if "<kind>" in line else ("",)
    for kind in kinds:
        args = [w.replace("<kind>", kind) for w in words]
        args = [f">{password}" if w == ">PASSWORD" else w for w in args]
        yield args[2], args


class Deployment:
    """A private server with the documented users and the engine's processes."""

    def __init__(self, server: RedisServer, work: Path) -> None:
        self.server, self.work = server, work
        self.port = server.url.rsplit(":", 1)[1].split("/")[0]
        self.password = secrets.token_hex(16)
        self.admin_password = secrets.token_hex(16)
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.extra: list[str] = []  # the add-on lines, granted during the scenario
        self.env = dict(os.environ, PYTHONPATH=str(ROOT))

    def url(self, user: str) -> str:
        password = self.admin_password if user == "admin" else self.password
        return f"redis://{user}:{password}@127.0.0.1:{self.port}/0"

    def admin(self) -> redis.Redis:
        return redis.Redis.from_url(self.url("admin"), decode_responses=True)

    def start(self, user: str, *command: str) -> None:
        log = (self.work / f"{user}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", *command, "--redis-url", self.url(f"flowstream-{user}")],
            env=self.env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append((user, proc))

    def lifecycle(
        self, user: str, *args: str, timeout: float = 20
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "lifecycle",
                *args,
                "--redis-url",
                self.url(f"flowstream-{user}"),
            ],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop(self) -> dict[str, int]:
        for _, proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        codes = {}
        for user, proc in self.procs:
            try:
                codes[user] = proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[user] = proc.wait()
        return codes

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}"
            for path in sorted(self.work.glob("*.log"))
        )


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    work = tmp_path_factory.mktemp("acl")
    (work / "resources").mkdir()
    (work / "resources" / "in.json").write_text('{"x": 1}', encoding="utf-8")
    server = RedisServer().start()
    deployment = Deployment(server, work)
    try:
        bootstrap = redis.Redis.from_url(server.url)
        bootstrap.execute_command(
            "ACL", "SETUSER", "admin", "on", f">{deployment.admin_password}", "~*", "&*", "+@all"
        )
        bootstrap.execute_command("ACL", "SETUSER", "default", "off")
        bootstrap.close()
        base, extra = acl_blocks()
        admin = deployment.admin()
        for line in base:
            for _, args in user_commands(line, deployment.password):
                admin.execute_command(*args)
        deployment.start("receipts", "lifecycle", "receipts", "--archive", str(work / "archive"))
        deployment.start("lifecycle", "lifecycle", "worker", "--no-wait", "--claim-idle", "2")
        deployment.start("tasks-default", "workers", "noop", "--kinds", "default")
        deployment.start(
            "tasks-k", "workers", "run", "tests.test_acl:Step", "--concurrency", "2",
            "--claim-idle", "1",
        )  # fmt: skip
        deployment.start("wait", "workers", "wait")
        deployment.start("resource", "workers", "resource", "--base-dir", str(work / "resources"))
        deployment.extra = extra
        yield deployment
    finally:
        deployment.stop()  # a no-op for processes already stopped by the scenario
        server.stop()


def acl_denials(admin: redis.Redis) -> list[str]:
    """What the ACL refused, but the start-up probe of the server's settings (CONFIG GET,
    deliberately not granted: it would show the server's password; the probe then stays
    silent, docs/security.md)."""
    entries = admin.execute_command("ACL", "LOG")
    denials = []
    for entry in entries:
        fields = (
            entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2], strict=True))
        )
        if fields["object"] == "config|get":
            continue
        denials.append(
            f"{fields['username']}: {fields['reason']} {fields['object']} ({fields['context']})"
        )
    return denials


def wait_for(predicate: Any, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_every_component_runs_workflows_end_to_end_under_its_documented_acl_user(
    deployment: Deployment, tmp_path: Path
) -> None:
    admin = deployment.admin()
    # Kind k limited: its workers take and release slots (kind_slots.lua) as they run.
    set_kind_limit(admin, Keys(), "k", 4)
    flows = {
        "files": "<in.json> → A → k:b → wait:delay (- duration: 100ms -) → <out.json>",
        "retried": "k:fail (- {$retries: 1, $backoff: 0.1} -)",
        "timeout": "k:slow (- $timeout: 0.5 -)",
        "waits": "wait:acquire (- name: L -) → wait:release (- name: L -)"
        " → wait:countdown (- name: L -) → k:b (- check: true -) → wait:event (- event: ping -)",
    }
    for name, text in flows.items():
        (tmp_path / f"{name}.flow").write_text(text + "\n", encoding="utf-8")

    # A submitter that can read nothing starts a workflow; a reader sees it finish.
    submitter = redis.Redis.from_url(deployment.url("flowstream-submit"))
    # Of priority 3: each of its tasks goes to its kind's priority stream, which every
    # worker, the receipts worker and the lifecycle's dead-task reader must reach.
    start_workflow(submitter, compile_text(flows["files"]), workflow_id="wf1", priority=3)
    wait_for(
        lambda: "finished" in deployment.lifecycle("reader", "list").stdout,
        "wf1 to finish\n" + deployment.logs(),
    )
    stored = (deployment.work / "resources" / "out.json").read_text(encoding="utf-8")
    assert '"seen"' in stored and '"x"' in stored

    # The documented extra grants: `lifecycle run`, and Task.cancelled() for kind k.
    for line in deployment.extra:
        for _, args in user_commands(line, deployment.password):
            admin.execute_command(*args)
    retried = deployment.lifecycle("submit", "run", str(tmp_path / "retried.flow"), "--wait")
    assert retried.returncode == 1 and "asked to fail" in retried.stderr, retried.stderr
    timed_out = deployment.lifecycle("submit", "run", str(tmp_path / "timeout.flow"), "--wait")
    assert timed_out.returncode == 1 and "timed out" in timed_out.stderr, timed_out.stderr

    waiting = subprocess.Popen(
        [sys.executable, "-m", "lifecycle", "run", str(tmp_path / "waits.flow"), "--wait",
         "--id", "wf2", "--redis-url", deployment.url("flowstream-submit")],
        env=deployment.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    events = EventClient("{flow}:lifecycle", url=deployment.url("flowstream-submit"))
    # A forged answer and a malformed start-task: dead letters, not ACL refusals.
    events.append(
        message(
            {"workflow": "wf1", "key": "1", "attempt": 1, "status": "SUCCESS", "token": "0" * 16},
            kind="end-task",
        )
    )
    admin.xadd("{flow}:tasks:k", {"kind": "start-task", "garbage": "x"})
    deadline = time.monotonic() + 20
    while waiting.poll() is None and time.monotonic() < deadline:
        events.append(message({"workflow": "wf2", "output": {"pong": 1}}, kind="ping"))
        time.sleep(0.3)
    out, err = waiting.communicate(timeout=5)
    assert waiting.returncode == 0, err + deployment.logs()
    assert "pong" in out, out  # k:b, which calls Task.cancelled(), succeeded on the way

    # An operator holds, releases, stops and removes a workflow.
    start_workflow(
        submitter, compile_text("wait:delay (- duration: 60s -) → k:b"), workflow_id="wf3"
    )
    wait_for(lambda: "wf3" in deployment.lifecycle("reader", "list").stdout, "wf3 to start")
    for action, shown in (("pause", "paused"), ("resume", "running"),
                          ("terminate", "terminated"), ("delete", "deleted")):  # fmt: skip
        done = deployment.lifecycle("operator", action, "wf3")
        assert done.returncode == 0, f"{action}: {done.stderr}" + deployment.logs()
        assert done.stdout.strip() == f"workflow wf3: {shown}", done.stdout

    for command in (["inspect", "wf2"], ["list"], ["history", "wf1"]):
        shown = deployment.lifecycle("reader", *command)
        assert shown.returncode == 0, f"{command}: {shown.stderr}"
    assert admin.xlen("{flow}:lifecycle:dead") >= 1
    assert admin.xlen("{flow}:tasks:k:dead") == 1

    time.sleep(1.5)  # one trim interval: the receipts worker archives and trims
    codes = deployment.stop()
    assert codes == dict.fromkeys(codes, 0), str(codes) + deployment.logs()
    assert list((deployment.work / "archive").iterdir())
    assert acl_denials(admin) == [], deployment.logs()


def test_a_task_worker_user_can_answer_but_not_read_the_lifecycle_stream(
    deployment: Deployment,
) -> None:
    worker = redis.Redis.from_url(deployment.url("flowstream-tasks-default"))
    worker.xadd("{flow}:lifecycle", {"kind": '"probe"'})
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.xrange("{flow}:lifecycle")
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.hgetall("{flow}:wf:wf1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.xrange("{flow}:tasks:k")


def test_the_reader_user_cannot_write() -> None:
    words = next(line for line in acl_blocks()[0] if "flowstream-reader" in line).split()
    granted = {word[1:] for word in words if word.startswith("+")}
    assert not granted & {"xadd", "hset", "set", "del", "xack", "xtrim", "eval", "evalsha"}
    assert [word for word in words if "~" in word] == ["%R~{flow}:*"]
