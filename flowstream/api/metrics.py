"""``GET /metrics``: the process's Prometheus metrics in the text format.

Every metric registered with ``prometheus_client``'s default registry is shown,
so the engine's metrics appear here once the process registers them.
"""

from __future__ import annotations

__all__ = ["metrics_text"]


def metrics_text() -> tuple[bytes, str]:
    """The exposition text and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
