"""Dead letters over HTTP: listed as the CLI lists them, requeued once."""

from __future__ import annotations

from typing import Any

import redis

from lifecycle.keys import TASK_GROUP
from rqse import EventListener
from rqse.keys import dead_letter_key
from tests.api.conftest import Served, wait_state


class Crashes(EventListener):
    """A task worker whose process() raises: rqse dead-letters the entry at once."""

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        raise RuntimeError("model file missing")


def test_a_dead_letter_is_listed_then_requeued_to_its_stream_once(served: Served) -> None:
    with served.client() as http:
        workflow_id = http.post("/api/workflows", json={"flow": "ml:A"}).json()["id"]
        wait_state(http, workflow_id, ("running",))
        stream = served.keys.tasks("ml")
        pool = redis.ConnectionPool(**served.redis.connection_pool.connection_kwargs)
        worker = Crashes(stream, TASK_GROUP, pool=pool, handle_signals=False, max_deliveries=1)
        worker.listen(idle_timeout=0.5)
        pool.disconnect()
        (letter,) = http.get("/api/dead-letters").json()["items"]
        assert (letter["source"], letter["error"]) == ("ml", "RuntimeError: model file missing")
        before = served.redis.xlen(stream)
        done = http.post("/api/dead-letters/requeue", json={"stream": "ml", "id": letter["id"]})
        assert done.status_code == 200, done.text
        assert done.json()["new_id"] and served.redis.xlen(stream) == before + 1
        assert served.redis.xlen(dead_letter_key(stream)) == 0
        again = http.post("/api/dead-letters/requeue", json={"stream": "ml", "id": letter["id"]})
        assert again.status_code == 404
