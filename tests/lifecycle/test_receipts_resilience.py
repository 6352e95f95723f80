"""The receipts worker never stops for an entry, never trims what it did not archive,
keeps a corrupt archive line as evidence, and exits on SIGTERM. Real Redis, real files."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis

from lifecycle.audit.archive import ArchivedEvent, ArchiveProblem, iter_archive, raw_value
from lifecycle.audit.receipts import ReceiptsWorker
from lifecycle.audit.segments import SegmentSink
from lifecycle.keys import LIFECYCLE_GROUP, RECEIPTS_GROUP
from tests.lifecycle.audit_helpers import KEYS, archive_all, assert_exactly_once

POISON = {
    "deep": b"[" * 100_000 + b"]" * 100_000,  # crash-looped the worker: RecursionError
    "bad-json": b'{"a":',
    "huge-int": b"9" * 5000,
    "not-utf8": b'"\xff\xfe"',
    "surrogate": b'"\\udc00"',
}


def _add_poison(client: redis.Redis) -> dict[str, str]:
    """One entry per poison value; returns entry id -> the poison's name."""
    return {
        client.xadd(KEYS.lifecycle, {"kind": b'"end-task"', "output": value}).decode(): name
        for name, value in POISON.items()
    } | {client.xadd(KEYS.lifecycle, {b"\xc3\x28": b"1"}).decode(): "name-not-utf8"}


def test_undecodable_values_are_archived_raw_and_the_worker_goes_on(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    before = redis_client.xadd(KEYS.lifecycle, {"kind": b'"end-task"', "output": b"1"}).decode()
    poisoned = _add_poison(redis_client)
    after = redis_client.xadd(KEYS.lifecycle, {"kind": b'"end-task"', "output": b"2"}).decode()
    worker = archive_all(redis_client, tmp_path)
    assert worker.stats.errors == 0 and worker.stats.raw == len(poisoned)
    records = {
        item.id: item.record
        for item in iter_archive(tmp_path)
        if isinstance(item, ArchivedEvent) and item.id
    }
    assert records[before]["event"] == {"kind": "end-task", "output": 1}
    assert records[after]["event"] == {"kind": "end-task", "output": 2}
    for entry_id, name in poisoned.items():
        record = records[entry_id]
        if name == "name-not-utf8":
            assert record["raw"] == {"\\xc3(": "MQ=="} and record["event"] == {}
            continue
        assert raw_value(record, "output") == POISON[name], name
        assert record["event"] == {"kind": "end-task"}, name
    assert_exactly_once(redis_client, tmp_path)


def test_a_restart_keeps_a_corrupt_middle_line_and_archives_what_follows(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    for n in range(5):
        redis_client.xadd(KEYS.lifecycle, {"kind": b'"probe"', "n": b"%d" % n})
    archive_all(redis_client, tmp_path)
    (segment,) = tmp_path.glob("segment-*.jsonl")
    lines = segment.read_bytes().split(b"\n")
    lines[2] = lines[2][:40] + b"\x00\x00 bit rot " + lines[2][60:]
    damaged = b"\n".join(lines)
    segment.write_bytes(damaged)
    later = [
        redis_client.xadd(KEYS.lifecycle, {"kind": b'"probe"', "n": b"%d" % n}).decode()
        for n in range(5, 8)
    ]
    worker = archive_all(redis_client, tmp_path)
    assert worker.stats.archived == len(later)
    assert segment.read_bytes().startswith(damaged)
    items = list(iter_archive(tmp_path))
    assert [(i.file, i.line) for i in items if isinstance(i, ArchiveProblem)] == [(segment.name, 3)]
    assert [i.id for i in items if isinstance(i, ArchivedEvent) and i.id][-3:] == later


def _trim_setup(client: redis.Redis, tmp_path: Path) -> tuple[ReceiptsWorker, SegmentSink]:
    """Ten entries, five archived, the engine's group past them all."""
    for n in range(5):
        client.xadd(KEYS.lifecycle, {"kind": b'"probe"', "n": b"%d" % n})
    archive_all(client, tmp_path)
    for n in range(5, 10):
        client.xadd(KEYS.lifecycle, {"kind": b'"probe"', "n": b"%d" % n})
    client.xgroup_create(KEYS.lifecycle, LIFECYCLE_GROUP, id="$")
    sink = SegmentSink(tmp_path)
    worker = ReceiptsWorker(client, sink, KEYS, trim_every=0.0)
    worker._discover()
    return worker, sink


def test_a_receipts_group_ahead_of_the_archive_does_not_let_unarchived_entries_be_trimmed(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    worker, sink = _trim_setup(redis_client, tmp_path)
    redis_client.xgroup_setid(KEYS.lifecycle, RECEIPTS_GROUP, "$")  # by hand, past the archive
    worker._trim()
    sink.close()
    assert redis_client.xlen(KEYS.lifecycle) == 10 and worker.stats.trimmed == 0


def test_a_stream_whose_receipts_group_was_destroyed_is_not_trimmed(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    worker, sink = _trim_setup(redis_client, tmp_path)
    redis_client.xgroup_destroy(KEYS.lifecycle, RECEIPTS_GROUP)
    worker._trim()
    sink.close()
    assert redis_client.xlen(KEYS.lifecycle) == 10 and worker.stats.trimmed == 0


def test_trimming_stops_at_the_last_archived_entry(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    worker, sink = _trim_setup(redis_client, tmp_path)
    worker._trim()
    sink.close()
    # XTRIM MINID keeps its bound: the last archived entry and the five after it.
    remaining = [orjson.loads(f[b"n"]) for _, f in redis_client.xrange(KEYS.lifecycle)]
    assert remaining == [4, 5, 6, 7, 8, 9] and worker.stats.trimmed == 4


def test_the_command_archives_past_poison_and_exits_0_on_sigterm(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    poisoned = _add_poison(redis_client)
    command = [sys.executable, "-m", "lifecycle", "receipts", "--archive", str(tmp_path / "a")]
    proc = subprocess.Popen(
        [*command, "--redis-url", redis_url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            (group,) = [
                g
                for g in redis_client.xinfo_groups(KEYS.lifecycle)
                if g["name"].decode() == RECEIPTS_GROUP
            ] or [{"last-delivered-id": b"0-0"}]
            if group["last-delivered-id"].decode() == max(poisoned):
                break
            assert proc.poll() is None, "the worker exited on a poisoned entry"
            assert time.monotonic() < deadline, "the poisoned entries were not archived"
            time.sleep(0.05)
        time.sleep(0.3)  # a few more turns of the loop past them
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert code == 0, stderr
    assert "Traceback" not in stderr and "stopped on signal 15" in stderr
    assert_exactly_once(redis_client, tmp_path / "a")


def test_an_unexpected_error_is_logged_and_the_batch_archived_once_after_a_backoff(
    redis_client: redis.Redis, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class FailingOnce(SegmentSink):
        """A sink whose first flush fails as a bug would (not a disk refusal)."""

        failed = False

        def flush(self) -> None:
            if not self.failed:
                self.failed = True
                raise RuntimeError("a bug in a sink")
            super().flush()

    ids = [redis_client.xadd(KEYS.lifecycle, {"n": b"%d" % n}).decode() for n in range(5)]
    sink = FailingOnce(tmp_path)
    worker = ReceiptsWorker(redis_client, sink, KEYS, block_ms=20, trim_every=None, retry_max=0.1)
    worker.run(idle_timeout=0.5)
    sink.close()
    assert worker.stats.errors == 1 and "unexpected error; retrying" in caplog.text
    archived = [i.id for i in iter_archive(tmp_path) if isinstance(i, ArchivedEvent) and i.id]
    assert archived == ids


def test_a_start_workflow_naming_a_graph_key_of_the_wrong_type_does_not_stall_the_worker(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    redis_client.hset(KEYS.graph("bad"), "not", "a string")
    fields = {"kind": b'"start-workflow"', "workflow": b'"w"', "graph": b'"bad"'}
    ids = [redis_client.xadd(KEYS.lifecycle, fields).decode()]
    ids.append(redis_client.xadd(KEYS.lifecycle, {"kind": b'"probe"'}).decode())
    worker = archive_all(redis_client, tmp_path)
    assert worker.stats.errors == 0
    records = [i.record for i in iter_archive(tmp_path) if isinstance(i, ArchivedEvent)]
    assert [r["id"] for r in records if "id" in r] == ids
    assert not [r for r in records if "graph" in r and "text" in r]


def test_a_task_key_that_is_not_a_stream_is_reported_once_and_the_others_archived(
    redis_client: redis.Redis, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    redis_client.sadd(KEYS.kinds, "broken", "fine")
    redis_client.set(KEYS.tasks("broken"), "a string")
    ids = [redis_client.xadd(KEYS.tasks("fine"), {"n": b"%d" % n}).decode() for n in range(3)]
    sink = SegmentSink(tmp_path)
    worker = ReceiptsWorker(redis_client, sink, KEYS, block_ms=20, rescan_every=0.0)
    worker.run(idle_timeout=0.3)
    sink.close()
    assert worker.stats.errors == 0
    assert caplog.text.count(f"{KEYS.tasks('broken')}: not archived") == 1
    archived = [i.id for i in iter_archive(tmp_path) if isinstance(i, ArchivedEvent) and i.id]
    assert archived == ids


def test_a_backlog_read_ahead_of_its_archiving_is_archived_once_in_id_order(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    redis_client.sadd(KEYS.kinds, "default")
    for n in range(250):
        redis_client.xadd(KEYS.lifecycle, {"n": b"%d" % n})
        if n % 2:
            redis_client.xadd(KEYS.tasks("default"), {"n": b"%d" % n})
    worker = archive_all(redis_client, tmp_path, batch_size=20)
    assert worker.stats.read_ahead >= 10  # each full batch sent the next XREAD ahead
    counts = assert_exactly_once(redis_client, tmp_path)
    assert counts == {KEYS.lifecycle: 250, KEYS.tasks("default"): 125}


def test_a_batch_that_fails_after_the_next_read_went_out_is_archived_once_after_a_backoff(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    class FailingThird(SegmentSink):
        """A sink whose third flush fails as a bug would, with a read sent ahead."""

        flushes = 0

        def flush(self) -> None:
            self.flushes += 1
            if self.flushes == 3:
                raise RuntimeError("a bug in a sink")
            super().flush()

    ids = [redis_client.xadd(KEYS.lifecycle, {"n": b"%d" % n}).decode() for n in range(95)]
    sink = FailingThird(tmp_path)
    worker = ReceiptsWorker(
        redis_client, sink, KEYS, batch_size=10, block_ms=20, trim_every=None, retry_max=0.1
    )
    worker.run(idle_timeout=0.5)
    sink.close()
    assert worker.stats.errors == 1 and worker.stats.read_ahead > 3
    archived = [i.id for i in iter_archive(tmp_path) if isinstance(i, ArchivedEvent) and i.id]
    assert archived == ids
