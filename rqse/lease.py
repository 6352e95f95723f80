"""Lease: keep the batch a listener is working on from being claimed by others.

Other consumers take over entries idle longer than ``claim_idle`` (XAUTOCLAIM);
that is how a crashed consumer's work is recovered. A live consumer whose
``process()`` runs longer than that must not lose its entries, so a daemon
thread resets their idle time every ``claim_idle / 3`` seconds
(``scripts/renew_lease.lua``). Renewal does not count as a delivery. If the
process dies, renewal stops and the entries become claimable.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import redis

from rqse.lua import load_script

__all__ = ["Lease"]

logger = logging.getLogger(__name__)


class Lease:
    """Renews the entries of the batch in hand, from a background thread."""

    def __init__(self, client: redis.Redis, group: str, consumer: str, interval: float) -> None:
        self._client = client
        self._group = group
        self._consumer = consumer
        self._interval = interval
        self._script = load_script(client, "renew_lease")
        # (stream, entries) of the batch in hand; replaced whole, so the
        # renewing thread always sees a consistent pair.
        self._held: tuple[str, Sequence[tuple[bytes, Any]]] | None = None
        self._released: set[bytes] = set()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, stream: str, entries: Sequence[tuple[bytes, Any]]) -> None:
        """Entries from now on in hand (replaces the previous batch)."""
        self._released = set()
        self._held = (stream, entries)

    def release(self, entry_id: bytes) -> None:
        """Stop renewing one entry (it failed and must become claimable)."""
        self._released.add(entry_id)

    def clear(self) -> None:
        self._held = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._done.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"rqse-lease-{self._consumer}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing and wait for the thread; idempotent."""
        self._done.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def renew(self) -> int:
        """Renew the entries in hand now; return how many were still ours."""
        held = self._held
        if held is None:
            return 0
        stream, entries = held
        released = self._released
        ids = [entry_id for entry_id, _ in entries if entry_id not in released]
        if not ids:
            return 0
        return int(self._script(keys=[stream], args=[self._group, self._consumer, *ids]))

    def _run(self) -> None:
        while not self._done.wait(self._interval):
            try:
                self.renew()
            except redis.RedisError as e:
                # The main loop sees the same outage and reconnects; nothing to do here.
                logger.debug("consumer %s: lease renewal failed: %s", self._consumer, e)
