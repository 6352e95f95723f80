"""A listener in its own process, for the crash and signal tests.

usage: python child_listener.py URL STREAM GROUP CONSUMER HANG_AT MODE

Every event's ``n`` is pushed on the list ``done`` once processed. At
``n == HANG_AT`` the event is first announced on ``started``, then held:

* ``wait``:  ``self.sleep(60)`` - returns early when a stop is requested;
* ``stuck``: as ``wait``, then announces ``stopping`` and blocks for ever
  (a task that ignores the stop request).

``onStop`` sets the key ``stopped``.
"""

from __future__ import annotations

import sys
from typing import Any

import redis

from rqse import EventListener


class Child(EventListener):
    def __init__(self, *args: Any, hang_at: int, mode: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.hang_at = hang_at
        self.mode = mode
        self.side = redis.Redis.from_url(kw["url"], socket_timeout=None)

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        n = event["n"]
        if n == self.hang_at:
            self.side.rpush("started", n)
            self.sleep(60)
            if self.mode == "stuck":
                self.side.rpush("stopping", n)
                self.side.blpop(["never"], timeout=0)
        self.side.rpush("done", n)
        return True

    def onStop(self) -> None:  # noqa: N802
        self.side.set("stopped", self.consumer)


def main(argv: list[str]) -> int:
    url, stream, group, consumer, hang_at, mode = argv
    listener = Child(
        stream, group, consumer=consumer, url=url, batch_size=10, hang_at=int(hang_at), mode=mode
    )
    listener.listen()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
