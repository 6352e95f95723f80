"""Test helpers: deadlines instead of sleeps, listeners in threads."""

from __future__ import annotations

import threading
from typing import Any

from rqse import EventListener


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
