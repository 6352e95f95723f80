"""Worker processes for tests: started with ``python -m``, stopped at teardown."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis

from lifecycle.keys import Keys


class Processes:
    """``start("lifecycle", "worker")`` runs ``python -m lifecycle worker --redis-url URL``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *command: str, stderr: bool = False) -> subprocess.Popen[bytes]:
        """``stderr=True`` keeps the process's stderr readable (``proc.stderr``)."""
        proc = subprocess.Popen(
            [sys.executable, "-m", *command, "--redis-url", self.url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE if stderr else subprocess.DEVNULL,
        )
        self.procs.append(proc)
        return proc

    def lifecycle(self, consumer: str, claim_idle: float = 2.0) -> subprocess.Popen[bytes]:
        return self.start(
            "lifecycle", "worker", "--consumer", consumer, "--claim-idle", str(claim_idle)
        )

    def noop(self, consumer: str) -> subprocess.Popen[bytes]:
        return self.start("workers", "noop", "--kinds", "default", "--consumer", consumer)

    def stop_all(self) -> None:
        """SIGTERM everything still running, SIGKILL what has not exited 10 s later."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


def wait_until_all_ended(
    client: redis.Redis,
    ids: list[str],
    timeout: float,
    during: Callable[[], None] | None = None,
    keys: Keys | None = None,
) -> dict[str, Any]:
    """Each workflow's stored state once all of ``ids`` are finished or failed; calls
    ``during`` between polls (to inject faults)."""
    workflow_key = (keys or Keys()).workflow
    deadline = time.monotonic() + timeout
    while True:
        pipe = client.pipeline(transaction=False)
        for workflow in ids:
            pipe.hget(workflow_key(workflow), "s")
        states = {w: orjson.loads(s) if s else {} for w, s in zip(ids, pipe.execute(), strict=True)}
        if all(s.get("status") in ("finished", "failed") for s in states.values()):
            return states
        if time.monotonic() > deadline:
            stuck = [w for w, s in states.items() if s.get("status") not in ("finished", "failed")]
            raise AssertionError(f"{len(stuck)} workflows did not end, e.g. {stuck[:3]}")
        if during is not None:
            during()
        time.sleep(0.2)
