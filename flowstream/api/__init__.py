"""The HTTP API (and the console it serves), for ``python -m lifecycle serve``.

Needs the ``api`` extra (FastAPI, uvicorn, python-multipart);
nothing here is imported by the engine, and :func:`create_app` imports the web
framework only when called, so the engine runs without the extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis
    from fastapi import FastAPI

    from flowstream.api.context import ApiConfig
    from lifecycle.keys import Keys

__all__ = ["create_app", "metrics_text"]


def create_app(config: ApiConfig) -> FastAPI:
    """The ASGI application (:func:`flowstream.api.app.create_app`)."""
    from flowstream.api.app import create_app as build

    return build(config)


def metrics_text(client: redis.Redis, keys: Keys) -> tuple[bytes, str]:
    """The Prometheus text ``/metrics`` serves and its content type."""
    from flowstream.api.metrics import metrics_text as render

    return render(client, keys)


def __getattr__(name: str) -> Any:
    if name == "ApiConfig":
        from flowstream.api.context import ApiConfig

        return ApiConfig
    raise AttributeError(name)
