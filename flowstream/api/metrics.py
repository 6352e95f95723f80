"""``GET /metrics``: the engine's Prometheus metrics in the text format.

The API runs no worker, so it serves what :func:`lifecycle.metrics.metrics_text`
reads from Redis when scraped (streams, lag, pending, dead letters, workflows by
state; cached a second), the same collectors a lifecycle worker's
``--metrics-port`` serves.
"""

from __future__ import annotations

import redis

from lifecycle.keys import Keys
from lifecycle.metrics import CONTENT_TYPE
from lifecycle.metrics import metrics_text as engine_text

__all__ = ["metrics_text"]


def metrics_text(client: redis.Redis, keys: Keys) -> tuple[bytes, str]:
    """The exposition text and its content type."""
    return engine_text(client, keys), CONTENT_TYPE
