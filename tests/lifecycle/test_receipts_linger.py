"""The receipts worker's linger: fuller batches when it keeps up, no wait behind a backlog."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from lifecycle.audit.receipts import ReceiptsWorker
from lifecycle.audit.segments import SegmentSink
from tests.conftest import wait_until
from tests.lifecycle.audit_helpers import KEYS, assert_exactly_once


def _add(client: redis.Redis, n: int) -> None:
    client.xadd(KEYS.lifecycle, {"kind": b'"note"', "n": str(n).encode()})


@contextmanager
def _running(worker: ReceiptsWorker) -> Iterator[threading.Thread]:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(timeout=10)


def test_entries_sent_while_the_worker_lingers_after_a_batch_are_archived_as_one_batch(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    _add(redis_client, 0)
    sink = SegmentSink(tmp_path)
    worker = ReceiptsWorker(
        redis_client, sink, KEYS, block_ms=20, trim_every=None, rescan_every=60, linger=2.0
    )
    with _running(worker):
        wait_until(lambda: worker.stats.archived == 1, what="the first entry archived")
        _add(redis_client, 1)
        time.sleep(0.1)  # a worker that did not linger would read this one alone (20 ms)
        _add(redis_client, 2)
        wait_until(lambda: worker.stats.archived == 3, what="the two later entries")
    sink.close()
    assert worker.stats.batches == 2
    assert_exactly_once(redis_client, tmp_path)


def test_behind_a_backlog_the_worker_reads_on_without_lingering_and_stop_cuts_a_linger_short(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    for n in range(25):
        _add(redis_client, n)
    sink = SegmentSink(tmp_path)
    worker = ReceiptsWorker(
        redis_client, sink, KEYS, batch_size=10, block_ms=20, trim_every=None, linger=30.0
    )
    began = time.monotonic()
    with _running(worker) as thread:
        # Two full batches, then one of 5 (after which it lingers): none waited for.
        wait_until(lambda: worker.stats.archived == 25, what="the backlog archived")
        assert time.monotonic() - began < 10
        stopped = time.monotonic()
        worker.stop()
        thread.join(timeout=10)
        assert not thread.is_alive() and time.monotonic() - stopped < 5
    sink.close()
    assert worker.stats.batches == 3
    assert_exactly_once(redis_client, tmp_path)
