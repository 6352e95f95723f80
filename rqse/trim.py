"""Trimming: keep streams bounded without removing anything still needed.

Two policies, documented in ``docs/events.md`` ("Trimming"):

* **acknowledged** (safe, :func:`trim_acknowledged`): remove the entries every
  consumer group has read and acknowledged, and that the receipt log no longer
  needs. One atomic Lua script (``scripts/trim_acknowledged.lua``); run it
  periodically (from a worker's loop, cron, ...). A new group created later
  will not see removed entries.
* **explicit** (``EventClient.append(..., maxlen=/minid=)`` or
  ``EventClient.trim``): cap by length or age regardless of readers; for
  streams whose readers may lag and lose, e.g. dead-letter or audit streams.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from rqse.client import EventClient
from rqse.connection import translate_errors
from rqse.keys import RECEIPT_GROUP
from rqse.lua import load_script

__all__ = ["TrimResult", "trim_acknowledged"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrimResult:
    """Entries removed, and the MINID used (None when nothing could be trimmed)."""

    removed: int
    bound: str | None


def trim_acknowledged(
    client: EventClient | redis.Redis,
    key: str | None = None,
    *,
    receipt_group: str | None = RECEIPT_GROUP,
    scan_limit: int = 1000,
) -> TrimResult:
    """Remove entries of ``key`` below the lowest id any group still needs.

    ``key`` defaults to the client's stream. ``receipt_group`` names the receipt
    log's group (None if receipts are not archived): receipts it has not
    archived keep their targets. If it lags more than ``scan_limit`` entries,
    nothing is removed.
    """
    if isinstance(client, EventClient):
        stream = key or client.key
        connection = client.connection
    else:
        if key is None:
            raise ValueError("key is required when client is a redis.Redis")
        stream, connection = key, client
    script = load_script(connection, "trim_acknowledged")
    with translate_errors("trim_acknowledged", repr(stream)):
        removed, bound = script(keys=[stream], args=[receipt_group or "", scan_limit])
    bound_id = bound.decode() if isinstance(bound, bytes) else bound
    if removed:
        logger.info(
            "stream %s: trimmed %d acknowledged entries below %s", stream, removed, bound_id
        )
    return TrimResult(int(removed), bound_id or None)
