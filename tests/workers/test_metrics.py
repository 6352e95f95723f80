"""``python -m workers run ... --metrics-port``: a TaskListener's tasks timed per kind."""

from __future__ import annotations

import redis

from tests.processes import Processes
from tests.scrape import events, free_port, labels, scrape_until
from tests.workers.helpers import KEYS, submit, wait_for_end


def test_a_task_listener_process_times_each_task_of_its_kind(
    processes: Processes, redis_client: redis.Redis
) -> None:
    port = free_port()
    processes.start("lifecycle", "worker", "--no-wait")
    target = "tests.workers.test_task_listener:Upper"
    processes.start("workers", "run", target, "--concurrency", "2", "--metrics-port", str(port))
    workflow = submit(redis_client, '<[{"t": "a"}, {"t": "b"}, {"t": "c"}]> → * text:shout')
    assert wait_for_end(redis_client, workflow, timeout=30)["status"] == "finished"
    stream = KEYS.tasks("text")
    samples = scrape_until(port, lambda s: events(s, stream, "workers", "processed") == 3)
    # Two listeners of one stream and group in the process: counted together.
    assert events(samples, stream, "workers", "processed") == 3
    assert samples[("flowstream_task_seconds_count", labels(kind="text"))] == 3
    assert samples[("flowstream_task_seconds_bucket", labels(kind="text", le="+Inf"))] == 3
