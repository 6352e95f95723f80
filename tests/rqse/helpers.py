"""Test helpers: deadlines instead of sleeps, listeners in threads, a busy server."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from rqse import EventListener
from rqse.server import RedisServer
from tests.conftest import wait_until


class Running:
    """A listener listening in a background thread; ``stop()`` joins it."""

    def __init__(self, listener: EventListener, **listen_args: Any) -> None:
        self.listener = listener
        self.error: BaseException | None = None
        self.result: int | None = None
        self.thread = threading.Thread(target=self._run, args=(listen_args,), daemon=True)
        self.thread.start()

    def _run(self, listen_args: dict[str, Any]) -> None:
        try:
            self.result = self.listener.listen(**listen_args)
        except BaseException as e:  # surfaced by stop()
            self.error = e

    def stop(self, timeout: float = 10.0) -> int | None:
        self.listener.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "listener did not stop"
        if self.error is not None:
            raise self.error
        return self.result


@contextmanager
def busy_server(server: RedisServer) -> Iterator[None]:
    """A script spins on ``server`` while the block runs: past busy-reply-threshold
    every other command is answered BUSY. Killed at the end (it writes nothing)."""
    side = redis.Redis(port=server.port)
    side.config_set("busy-reply-threshold", 20)
    spinner = redis.Redis(port=server.port)

    def spin() -> None:
        with contextlib.suppress(redis.ResponseError):  # killed
            spinner.eval("while true do end", 0)

    def answers_busy() -> bool:
        try:
            side.ping()
        except redis.ResponseError as error:
            return str(error).startswith("BUSY")
        return False

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        # Waited for, not slept for: on a loaded machine the script may start late.
        wait_until(answers_busy, what="the server answering BUSY")
        yield
    finally:
        while thread.is_alive():
            with contextlib.suppress(redis.ResponseError):  # NOTBUSY: not yet, or just ended
                side.script_kill()
            thread.join(0.05)
        side.close()
        spinner.close()
