"""A listener in its own process for the shutdown tests.

usage: python weather_child.py URL DIRECT_URL DRAIN_TIMEOUT

Listens to ``jobs`` through URL (the test's proxy) with ``drain_timeout``;
announces itself on the list ``ready`` of DIRECT_URL (the server itself, which
the proxy's faults do not reach) once its group is established, and each
processed ``n`` on ``done``; an event with ``hold`` then waits for an item on
``go`` before ``process`` returns. ``onStop`` sets ``stopped``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import redis

from rqse import Backoff, EventListener


class Child(EventListener):
    def __init__(self, *args: Any, direct: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.side = redis.Redis.from_url(direct)

    def onEstablished(self) -> None:  # noqa: N802
        self.side.rpush("ready", self.consumer)

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        self.side.rpush("done", event["n"])
        if event.get("hold"):
            self.side.blpop(["go"], timeout=0)
        return True

    def onStop(self) -> None:  # noqa: N802
        self.side.set("stopped", self.consumer)


def main(argv: list[str]) -> int:
    url, direct, drain = argv
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    listener = Child(
        "jobs",
        "g",
        consumer="child",
        url=url,
        direct=direct,
        drain_timeout=float(drain),
        block_ms=5000,
        reconnect=Backoff(initial=0.05, maximum=5.0),
    )
    listener.listen()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
