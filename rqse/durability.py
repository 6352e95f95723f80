"""What a server's configuration risks for streams: eviction and lost writes.

Streams are the only copy of the events; a server that evicts keys under memory
pressure drops whole streams (and consumer groups) silently, and one without
persistence loses everything on a restart. :func:`server_warnings` says so in
one line each; listeners log them once when they start.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import redis

__all__ = ["server_warnings"]

logger = logging.getLogger(__name__)


def server_warnings(connection: redis.Redis) -> list[str]:
    """Warnings about the server's eviction policy and persistence (empty: none).

    One CONFIG GET round trip. Where CONFIG is disabled or not permitted (ACLs,
    managed services), nothing can be said: an empty list and a debug line. A
    lost connection is raised as any Redis error is.
    """
    try:
        pipe = connection.pipeline(transaction=False)
        for name in ("maxmemory", "maxmemory-policy", "appendonly", "save"):
            pipe.config_get(name)
        replies = pipe.execute()
    except redis.ResponseError as error:
        logger.debug("server configuration not readable (%s); no warnings checked", error)
        return []
    config: dict[str, str] = {}
    for reply in replies:
        config.update(_text_items(reply))
    return warnings_for(config)


def warnings_for(config: Mapping[str, str]) -> list[str]:
    """The warnings for a server configuration given as CONFIG GET's name -> value."""
    found = []
    policy = config.get("maxmemory-policy", "noeviction")
    maxmemory = config.get("maxmemory", "0")
    if policy != "noeviction" and maxmemory not in ("", "0"):
        found.append(
            f"Redis evicts keys when full (maxmemory-policy {policy}, maxmemory {maxmemory}): "
            "streams and their groups can vanish; set maxmemory-policy noeviction"
        )
    appendonly = config.get("appendonly", "no")
    save = config.get("save", "").strip()
    if "appendonly" in config and appendonly != "yes" and not save:
        found.append(
            "Redis has persistence off (no AOF, no RDB save points): a restart loses "
            "every stream; set appendonly yes"
        )
    return found


def _text_items(reply: Any) -> dict[str, str]:
    """CONFIG GET's reply (a dict in redis-py, values bytes or str) as text."""
    if isinstance(reply, Mapping):
        items: Any = reply.items()
    else:  # a flat name, value, ... list (RESP2 without redis-py's callback)
        items = zip(reply[::2], reply[1::2], strict=False)
    return {_text(name): _text(value) for name, value in items}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
