"""python -m lifecycle run --wait says, once, why a workflow does not move (no lifecycle
worker; no worker for a kind) and keeps waiting; a task a worker holds is no stall; Ctrl-C
stops the waiting, not the workflow, and says so."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from flowstream.cli import main
from lifecycle.cli import EXIT_ERROR, EXIT_FAILED, EXIT_OK
from lifecycle.worker import LifecycleWorker
from tests.conftest import wait_until
from workers import Task, TaskListener


def write_flow(tmp_path: Path, text: str) -> str:
    path = tmp_path / "stall.flow"
    path.write_text(text, encoding="utf-8")
    return str(path)


def run_wait(redis_url: str, flow: str, timeout: float, *extra: str) -> int:
    return main(
        ["run", flow, "--wait", "--timeout", str(timeout), "--warn-after", "1"]
        + ["--redis-url", redis_url, *extra]
    )


class Threads:
    """Listeners in threads on the test's Redis, stopped at teardown."""

    def __init__(self, url: str) -> None:
        self.pool = redis.ConnectionPool.from_url(url)
        self.running: list[tuple[Any, threading.Thread]] = []

    def start(self, listener: Any) -> None:
        thread = threading.Thread(target=listener.listen, daemon=True)
        thread.start()
        self.running.append((listener, thread))

    def stop(self) -> None:
        for listener, _ in self.running:
            listener.stop()
        for _, thread in self.running:
            thread.join(10)
        self.pool.disconnect()


@pytest.fixture
def threads(redis_url: str, redis_client: redis.Redis) -> Iterator[Threads]:
    running = Threads(redis_url)
    try:
        yield running
    finally:
        running.stop()


def test_no_lifecycle_worker_is_said_once_and_the_wait_goes_on(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path, capsys: Any
) -> None:
    flow = write_flow(tmp_path, "A")
    started = time.monotonic()
    assert run_wait(redis_url, flow, 3.5) == EXIT_ERROR  # waited out its timeout
    assert time.monotonic() - started >= 3.5
    lines = capsys.readouterr().err.splitlines()
    warning = (
        "still waiting: no lifecycle worker has read {flow}:lifecycle "
        "(start one: python -m lifecycle worker)"
    )
    assert lines.count(warning) == 1
    assert lines[-1].endswith("did not end within 3.5s")


def test_a_kind_nobody_serves_is_named_with_its_waiting_tasks(
    threads: Threads, redis_url: str, tmp_path: Path, capsys: Any
) -> None:
    threads.start(LifecycleWorker(pool=threads.pool, handle_signals=False, block_ms=100))
    flow = write_flow(tmp_path, "ml:train")
    assert run_wait(redis_url, flow, 3.5) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "no lifecycle worker" not in err
    warning = (
        "still waiting: no worker serves kind ml (1 task waiting on {flow}:tasks:ml; "
        "see python -m workers --help)"
    )
    assert err.splitlines().count(warning) == 1


class Slow(TaskListener):
    """Holds each task 2.5 s: longer than the warning delay, without reading meanwhile."""

    kind = "slow"

    def run(self, task: Task) -> Any:
        time.sleep(2.5)
        return {"slept": True}


def test_a_task_a_worker_holds_past_the_delay_is_no_stall(
    threads: Threads, redis_url: str, tmp_path: Path, capsys: Any
) -> None:
    threads.start(LifecycleWorker(pool=threads.pool, handle_signals=False, block_ms=100))
    threads.start(Slow(pool=threads.pool, handle_signals=False, block_ms=100))
    flow = write_flow(tmp_path, "slow:step")
    assert run_wait(redis_url, flow, 30) == EXIT_OK
    assert "still waiting" not in capsys.readouterr().err


def test_warn_after_zero_keeps_quiet(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path, capsys: Any
) -> None:
    flow = write_flow(tmp_path, "A")
    code = main(
        ["run", flow, "--wait", "--timeout", "2", "--warn-after", "0", "--redis-url", redis_url]
    )
    assert code == EXIT_ERROR
    assert "still waiting" not in capsys.readouterr().err


class Train(TaskListener):
    kind = "ml"

    def run(self, task: Task) -> Any:
        return {}


def test_a_kind_whose_only_worker_stopped_reading_is_named(
    threads: Threads, redis_client: redis.Redis, redis_url: str, tmp_path: Path, capsys: Any
) -> None:
    # The worker leaves its consumer in the group when it stops: the group exists, has a
    # consumer, yet nobody reads what arrives.
    gone = Train(pool=threads.pool, handle_signals=False, block_ms=100)
    thread = threading.Thread(target=gone.listen, daemon=True)
    thread.start()
    wait_until(lambda: redis_client.exists("{flow}:tasks:ml"), what="the ml group")
    gone.stop()
    thread.join(10)
    assert redis_client.xinfo_consumers("{flow}:tasks:ml", "workers")
    threads.start(LifecycleWorker(pool=threads.pool, handle_signals=False, block_ms=100))
    flow = write_flow(tmp_path, "ml:train")
    assert run_wait(redis_url, flow, 3.5) == EXIT_ERROR
    assert "still waiting: no worker serves kind ml (1 task waiting" in capsys.readouterr().err


def test_ctrl_c_while_waiting_says_the_workflow_goes_on(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    flow = write_flow(tmp_path, "A")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lifecycle", "run", flow, "--id", "wf-on", "--wait"]
        + ["--redis-url", redis_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "wf-on\n"  # submitted; now waiting
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == EXIT_FAILED
    assert err == "stopped waiting; workflow wf-on goes on (python -m lifecycle inspect wf-on)\n"


def test_a_submitter_that_may_not_look_at_groups_waits_without_warnings_or_errors(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path, capsys: Any
) -> None:
    # The documented user of `lifecycle run` (docs/security.md: flowstream-submit and its
    # line for `run`) holds no XINFO: the warnings are off, the wait goes on.
    from tests.test_acl import acl_blocks

    lines = [line for block in acl_blocks() for line in block if "flowstream-submit " in line]
    assert len(lines) == 2
    user, password = "flowstream-submit", "run-stall-test"
    for line in lines:
        words = line.split()[2:]
        redis_client.execute_command(
            "ACL", "SETUSER", *[f">{password}" if w == ">PASSWORD" else w for w in words]
        )
    try:
        flow = write_flow(tmp_path, "A")
        url = redis_url.replace("redis://", f"redis://{user}:{password}@")
        code = main(
            ["run", flow, "--wait", "--timeout", "2.5", "--warn-after", "1", "--redis-url", url]
        )
    finally:
        redis_client.execute_command("ACL", "DELUSER", user)
    assert code == EXIT_ERROR  # no lifecycle worker: it waited out its timeout
    err = capsys.readouterr().err
    assert err.endswith("did not end within 2.5s\n") and err.count("\n") == 1, err


def test_a_lifecycle_worker_that_took_the_start_and_went_silent_is_no_worker(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path, capsys: Any
) -> None:
    lifecycle = "{flow}:lifecycle"
    redis_client.xgroup_create(lifecycle, "lifecycle", id="$", mkstream=True)
    # A consumer that reads the start-workflow and is never heard of again.
    taker = threading.Timer(0.5, redis_client.xreadgroup, ("lifecycle", "gone", {lifecycle: ">"}))
    taker.start()
    assert run_wait(redis_url, write_flow(tmp_path, "A"), 3.5) == EXIT_ERROR
    taker.join()
    assert redis_client.xpending(lifecycle, "lifecycle")["pending"] == 1  # it took it
    assert "still waiting: no lifecycle worker has read" in capsys.readouterr().err
