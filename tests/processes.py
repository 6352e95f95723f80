"""Worker processes for tests: started with ``python -m``, stopped at teardown."""

from __future__ import annotations

import signal
import subprocess
import sys


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
