"""The receipts worker on a disk that fills up and turns read-only: a real tmpfs of 64 KiB
(the tests run as root), real Redis. It retries, says so once per state, never
acknowledges or trims what is not on disk, and archives everything once the disk
takes writes again."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from lifecycle.audit.archive import (
    ArchivedEvent,
    ArchiveError,
    ArchiveProblem,
    id_order,
    iter_archive,
)
from lifecycle.audit.receipts import ReceiptsWorker
from lifecycle.audit.segments import SegmentSink
from lifecycle.audit.verify import check_chain
from lifecycle.keys import LIFECYCLE_GROUP, RECEIPTS_GROUP
from tests.conftest import wait_until
from tests.lifecycle.audit_helpers import KEYS, assert_exactly_once


def _mount(*options: str, where: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *options, str(where)], capture_output=True, text=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, unmounted after the test."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", where=where)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _remount(where: Path, options: str) -> None:
    """Remount; retried while the worker holds the segment open for a moment."""
    deadline = time.monotonic() + 10
    while (done := _mount("-o", f"remount,{options}", where=where)).returncode != 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"remount {options}: {done.stderr}")
        time.sleep(0.01)


class Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def count(self, text: str) -> int:
        return sum(text in line for line in self.lines)


@pytest.fixture
def messages() -> Iterator[Messages]:
    handler = Messages()
    logger = logging.getLogger("lifecycle")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def _archived(directory: Path) -> list[str]:
    return [
        item.id
        for item in iter_archive(directory)
        if isinstance(item, ArchivedEvent) and item.id is not None
    ]


def _receipts_position(client: redis.Redis) -> str:
    (group,) = [
        g for g in client.xinfo_groups(KEYS.lifecycle) if g["name"].decode() == RECEIPTS_GROUP
    ]
    return str(group["last-delivered-id"].decode())


def _assert_nothing_unarchived_acked_or_trimmed(
    client: redis.Redis, archive: Path, ids: list[str]
) -> None:
    archived = _archived(archive)
    position = _receipts_position(client)
    assert id_order(position) <= id_order(archived[-1])
    held = {i.decode() for i, _ in client.xrange(KEYS.lifecycle)}
    assert set(ids[ids.index(position) + 1 :]) <= held


def test_a_full_then_read_only_disk_is_retried_and_nothing_unarchived_is_acked_or_trimmed(
    redis_client: redis.Redis, small_disk: Path, messages: Messages
) -> None:
    stream = KEYS.lifecycle
    # The engine's group exists and is past everything: only the receipts group holds
    # the stream back from trimming.
    redis_client.xgroup_create(stream, LIFECYCLE_GROUP, id="$", mkstream=True)
    payload = b'"' + b"x" * 2000 + b'"'
    ids = [redis_client.xadd(stream, {"kind": b'"probe"', "n": payload}).decode()]
    redis_client.xgroup_setid(stream, LIFECYCLE_GROUP, "$")
    archive = small_disk / "archive"
    sink = SegmentSink(archive)
    worker = ReceiptsWorker(
        redis_client, sink, KEYS, block_ms=20, batch_size=5, trim_every=0.0, retry_max=0.1
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: _archived(archive) == ids, 20.0, "the first entry archived")
        for _ in range(60):  # 120 KB: more than the disk holds
            ids.append(redis_client.xadd(stream, {"kind": b'"probe"', "n": payload}).decode())
        redis_client.xgroup_setid(stream, LIFECYCLE_GROUP, "$")
        full = f"archive disk full at {archive}/segment-000000000000.jsonl; retrying"
        wait_until(lambda: messages.count(full) > 0, 20.0, "the disk full message")
        wait_until(lambda: worker.stats.refused_flushes >= 5, 20.0, "more refused flushes")
        assert messages.count(full) == 1  # said once, however many retries
        # Nothing past the archive is acknowledged, and nothing unarchived trimmed away.
        _assert_nothing_unarchived_acked_or_trimmed(redis_client, archive, ids)
        _remount(small_disk, "ro")
        read_only = f"archive read-only at {archive}/segment-000000000000.jsonl; retrying"
        wait_until(lambda: messages.count(read_only) > 0, 20.0, "the read-only message")
        _assert_nothing_unarchived_acked_or_trimmed(redis_client, archive, ids)
        _remount(small_disk, "rw,size=4m")
        wait_until(lambda: _archived(archive) == ids, 20.0, "every entry archived")
        assert messages.count("archive writable again") >= 1
        assert thread.is_alive()
    finally:
        worker.stop()
        thread.join(timeout=30)
        sink.close()
    assert not thread.is_alive() and worker.stats.errors == 0
    assert messages.count(read_only) == 1
    assert not any("flush of closed file" in line for line in messages.lines)
    items = list(iter_archive(archive))
    assert not [i for i in items if isinstance(i, ArchiveProblem)]
    assert not check_chain([(i.line, i.record) for i in items if isinstance(i, ArchivedEvent)])[0]
    assert_exactly_once(redis_client, archive)


def test_stopped_while_the_disk_is_full_the_worker_returns_within_its_drain_timeout(
    redis_client: redis.Redis, small_disk: Path, messages: Messages
) -> None:
    stream = KEYS.lifecycle
    payload = b'"' + b"y" * 4000 + b'"'
    for _ in range(30):
        redis_client.xadd(stream, {"kind": b'"probe"', "n": payload})
    archive = small_disk / "archive"
    sink = SegmentSink(archive)
    worker = ReceiptsWorker(
        redis_client, sink, KEYS, block_ms=20, trim_every=None, drain_timeout=0.5, retry_max=0.1
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    wait_until(lambda: worker.stats.refused_flushes > 0, 20.0, "a refused flush")
    stopped = time.monotonic()
    worker.stop()
    thread.join(timeout=10)
    assert not thread.is_alive() and time.monotonic() - stopped < 2.0
    sink.close()
    assert messages.count("not archived") >= 1
    # Nothing was acknowledged: a worker on a bigger disk archives every entry once.
    _remount(small_disk, "rw,size=4m")
    assert _receipts_position(redis_client) in ("0-0", *_archived(archive))
    sink = SegmentSink(archive)
    ReceiptsWorker(redis_client, sink, KEYS, block_ms=20, trim_every=None).run(idle_timeout=0.3)
    sink.close()
    assert_exactly_once(redis_client, archive)
    assert os.listdir(archive)  # the archive is there, whole


def test_a_rotation_the_disk_refuses_keeps_writing_the_open_segment_until_it_can(
    tmp_path: Path, messages: Messages
) -> None:
    where = tmp_path / "inodes"
    where.mkdir()
    # Inodes for the root, the archive directory, its lock and one segment: no second file.
    mounted = _mount("-t", "tmpfs", "-o", "size=1m,nr_inodes=4", "tmpfs", where=where)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    try:
        archive = where / "archive"
        sink = SegmentSink(archive, segment_bytes=300)
        for number in range(6):
            sink.write([{"stream": "s", "id": f"1-{number}", "event": {"n": number}}])
            sink.flush()  # durable each time; only the rotation after it is refused
        assert [p.name for p in archive.glob("segment-*")] == ["segment-000000000000.jsonl"]
        assert messages.count(f"cannot start a new segment; {archive}/segment-0") == 1
        _remount(where, "nr_inodes=100")
        sink.write([{"stream": "s", "id": "1-6", "event": {"n": 6}}])
        sink.flush()
        sink.close()
        assert len(list(archive.glob("segment-*"))) == 2
        items = list(iter_archive(archive))
        assert not [i for i in items if isinstance(i, ArchiveProblem)]
        records = [(i.line, i.record) for i in items if isinstance(i, ArchivedEvent)]
        assert not check_chain(records)[0]
        assert [r["id"] for _, r in records if "id" in r] == [f"1-{n}" for n in range(7)]
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_second_sigterm_while_the_disk_is_full_exits_at_once_without_a_traceback(
    redis_url: str, redis_client: redis.Redis, small_disk: Path
) -> None:
    payload = b'"' + b"z" * 4000 + b'"'
    for _ in range(30):
        redis_client.xadd(KEYS.lifecycle, {"kind": b'"probe"', "n": payload})
    archive = small_disk / "archive"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lifecycle", "receipts", "--archive", str(archive)]
        + ["--redis-url", redis_url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the worker says it once, then retries
            if "archive disk full at" in line:
                break
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=5)
        rest = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert code == 128 + signal.SIGTERM, rest
    assert "Traceback" not in rest and "flush of closed file" not in rest
    assert "not archived, read again at the next start" in rest
    assert not [i for i in iter_archive(archive) if isinstance(i, ArchiveProblem)]
    # Nothing of the refused batch was acknowledged.
    archived = _archived(archive)
    assert _receipts_position(redis_client) in ("0-0", *archived)


def test_opening_an_archive_on_a_read_only_disk_is_one_clear_error(
    redis_client: redis.Redis, small_disk: Path
) -> None:
    archive = small_disk / "archive"
    SegmentSink(archive).close()
    _remount(small_disk, "ro")
    with pytest.raises(ArchiveError, match=r"archive.*: .*Read-only file system") as caught:
        SegmentSink(archive)
    assert "\n" not in str(caught.value)
