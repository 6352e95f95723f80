"""Redis killed and restarted under a running listener (private AOF server)."""

from __future__ import annotations

import logging

from rqse import Backoff, EventClient, EventListener, message
from rqse.server import RedisServer
from tests.conftest import wait_until


def test_a_listener_survives_redis_restarting_under_it_and_loses_no_event(
    own_server, run_listener, caplog
):
    caplog.set_level(logging.WARNING, logger="rqse")
    url = own_server.url
    seen: list[int] = []
    killed = []

    class Worker(EventListener):
        def process(self, event_id, event):
            seen.append(event["n"])
            if event["n"] == 5 and not killed:
                killed.append(True)
                own_server.kill()  # mid-batch: nothing of this batch is acknowledged yet
            return True

    worker = Worker(
        "jobs",
        "g",
        consumer="w",
        url=url,
        claim_idle=60,
        reconnect=Backoff(initial=0.05, maximum=0.2),
    )
    EventClient("jobs", url=url).append_many([message({"n": n}, kind="job") for n in range(10)])
    run = run_listener(worker)
    wait_until(lambda: worker.stats.reconnects >= 3, what="listener retrying while Redis is down")
    assert set(seen) == set(range(10)), "the batch was processed, its acknowledgement failed"

    own_server.start()
    wait_until(lambda: worker.established, what="listener re-established")
    after = EventClient("jobs", url=url)
    after.append_many([message({"n": n}, kind="job") for n in range(10, 20)])
    wait_until(lambda: set(seen) >= set(range(20)), what="every event processed")
    wait_until(
        lambda: after.connection.xpending("jobs", "g")["pending"] == 0,
        what="every event acknowledged",
    )
    run.stop()

    # The unacknowledged batch was processed again (at least once), nothing twice more.
    assert sorted(seen) == sorted([*range(10), *range(10), *range(10, 20)])
    # Backoff, not a busy loop: a handful of attempts, not thousands.
    assert worker.stats.reconnects <= 12
    assert "password" not in caplog.text
    assert "retrying in" in caplog.text
    after.close()


def test_a_listener_started_before_redis_waits_for_it(run_listener):
    server = RedisServer()  # not started yet
    try:
        seen = []

        class Worker(EventListener):
            def process(self, event_id, event):
                seen.append(event["n"])
                return True

        worker = Worker("jobs", "g", url=server.url, reconnect=Backoff(initial=0.05, maximum=0.1))
        run = run_listener(worker)
        wait_until(lambda: worker.stats.reconnects >= 2, what="listener retrying")
        server.start()
        EventClient("jobs", url=server.url).append(message({"n": 1}, kind="job"))
        wait_until(lambda: seen == [1], what="event processed once Redis is up")
        run.stop()
    finally:
        server.stop()
