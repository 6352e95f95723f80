"""The receipts worker joins the task streams of kinds that appear while it runs."""

from __future__ import annotations

import threading
from pathlib import Path

import redis

from lifecycle.audit.receipts import ReceiptsWorker
from lifecycle.audit.segments import SegmentSink
from lifecycle.keys import Keys
from rqse.keys import dead_letter_key
from tests.conftest import wait_until
from tests.lifecycle.audit_helpers import archived_ids

KEYS = Keys()


def test_a_kind_that_appears_while_the_receipts_worker_runs_is_archived_from_its_start(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    sink = SegmentSink(tmp_path)
    worker = ReceiptsWorker(
        redis_client, sink, KEYS, block_ms=50, rescan_every=0.05, trim_every=None
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: KEYS.lifecycle in worker.streams, what="the worker running")
        tasks, dead = KEYS.tasks("late"), dead_letter_key(KEYS.tasks("late"))
        first = redis_client.xadd(tasks, {"kind": b'"start-task"', "n": b"1"})  # before the kind
        redis_client.sadd(KEYS.kinds, "late")
        redis_client.xadd(dead, {"kind": b'"dead-letter"'})
        wait_until(lambda: {tasks, dead} <= set(worker.streams), what="both streams joined")
        second = redis_client.xadd(tasks, {"kind": b'"start-task"', "n": b"2"})
        wait_until(lambda: worker.stats.archived >= 3, what="three entries archived")
    finally:
        worker.stop()
        thread.join(timeout=10)
        sink.close()
    archived = archived_ids(tmp_path)
    assert archived[tasks] == [first.decode(), second.decode()]
    assert len(archived[dead]) == 1
