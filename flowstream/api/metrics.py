"""``GET /metrics``: the engine's Prometheus metrics in the text format.

The API runs no worker, so it serves what :func:`lifecycle.metrics.metrics_text`
reads from Redis when scraped (streams, lag, pending, dead letters, workflows by
state; cached a second), the same collectors a lifecycle worker's
``--metrics-port`` serves. With several partitions every partition's figures are
served, each sample labelled ``partition`` with its partition's prefix (stream
names hold it already; workflows by state and ``status_up`` need it).
"""

from __future__ import annotations

import threading

import redis
from prometheus_client import CollectorRegistry, generate_latest

from flowstream.api.context import Api
from lifecycle.keys import Keys
from lifecycle.metrics import CONTENT_TYPE, PartitionsCollector
from lifecycle.metrics import metrics_text as engine_text

__all__ = ["metrics_text", "served_metrics"]


def metrics_text(client: redis.Redis, keys: Keys) -> tuple[bytes, str]:
    """The exposition text of one partition and its content type."""
    return engine_text(client, keys), CONTENT_TYPE


_lock = threading.Lock()


def served_metrics(api: Api) -> tuple[bytes, str]:
    """What ``/metrics`` serves for ``api``'s deployment and its content type: one
    partition's figures as they always were, or every partition's labelled
    (:class:`PartitionsCollector`, made once per process so that its caches hold)."""
    try:
        places = api.places()
    except redis.RedisError:  # the count unread: the collector says Redis is down
        return metrics_text(api.config.redis, api.config.keys)
    if len(places) == 1:
        return metrics_text(places[0].redis, places[0].keys)
    with _lock:
        if api.metrics is None:
            registry = CollectorRegistry()
            registry.register(PartitionsCollector([(p.redis, p.keys) for p in places]))
            api.metrics = registry
    return generate_latest(api.metrics), CONTENT_TYPE
