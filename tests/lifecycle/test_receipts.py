"""The receipts worker: every entry archived once, across crashes, restarts and trimming."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from lifecycle.audit.archive import raw_value, read_archive
from lifecycle.audit.receipts import ReceiptsWorker
from lifecycle.audit.report import audit_archive
from lifecycle.audit.segments import SegmentSink
from lifecycle.audit.verify import check_chain
from lifecycle.cli import main
from lifecycle.keys import RECEIPTS_GROUP
from lifecycle.submit import start_workflow
from tests.lifecycle.archive_oracle import expected_fields
from tests.lifecycle.audit_helpers import (
    KEYS,
    archive_all,
    assert_exactly_once,
    engine_streams,
    run_in_harness,
)
from tests.lifecycle.harness import Harness


def test_every_entry_of_every_engine_stream_is_archived_once_with_stream_and_id(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    run_in_harness(redis_client, 20)
    worker = archive_all(redis_client, tmp_path)
    counts = assert_exactly_once(redis_client, tmp_path)
    assert set(counts) == {KEYS.lifecycle, KEYS.tasks("default")}
    assert worker.stats.archived == sum(counts.values())
    graphs = [r for _, r in read_archive(tmp_path) if "graph" in r]
    assert len(graphs) == 1  # archived once, before the first start-workflow naming it


def test_entries_pending_when_the_worker_died_are_archived_once_after_a_restart(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    run_in_harness(redis_client, 10)
    archive_all(redis_client, tmp_path)
    run_in_harness(redis_client, 5)  # more entries; a worker reads them and dies unacked
    for stream in engine_streams(redis_client):
        redis_client.xreadgroup(RECEIPTS_GROUP, "receipts", {stream: ">"}, count=7)
    worker = archive_all(redis_client, tmp_path)
    assert worker.stats.archived > 0
    assert_exactly_once(redis_client, tmp_path)


def test_entries_archived_but_not_acknowledged_before_a_crash_are_not_archived_again(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    run_in_harness(redis_client, 10)
    archive_all(redis_client, tmp_path)
    # As if the process died between fsync and moving its group: the group is behind.
    for stream in engine_streams(redis_client):
        redis_client.xgroup_setid(stream, RECEIPTS_GROUP, "0")
    second = archive_all(redis_client, tmp_path)
    assert second.stats.archived == 0
    assert_exactly_once(redis_client, tmp_path)
    # The next entries are archived, and the group catches up with the archive.
    probes = {s: redis_client.xadd(s, {"kind": b'"probe"'}) for s in engine_streams(redis_client)}
    assert archive_all(redis_client, tmp_path).stats.archived == len(probes)
    for stream, probe in probes.items():
        (group,) = [g for g in redis_client.xinfo_groups(stream) if g["name"] == b"receipts"]
        assert group["last-delivered-id"] == probe and group["pending"] == 0


def test_the_receipts_group_holds_no_pending_entries_and_marks_the_archived_position(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    run_in_harness(redis_client, 10)
    archive_all(redis_client, tmp_path)
    last = {r["stream"]: r["id"] for _, r in read_archive(tmp_path) if "stream" in r}
    for stream in engine_streams(redis_client):
        (group,) = [g for g in redis_client.xinfo_groups(stream) if g["name"] == b"receipts"]
        assert group["pending"] == 0
        assert group["last-delivered-id"].decode() == last[stream]


def test_a_line_torn_by_a_crash_is_dropped_and_its_entry_archived_again(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    run_in_harness(redis_client, 3)
    archive_all(redis_client, tmp_path)
    (segment,) = tmp_path.glob("segment-*.jsonl")
    data = segment.read_bytes()
    *_, last, seal = data.rstrip(b"\n").split(b"\n")  # the last entry, its batch's seal
    start = len(data) - len(seal) - 1 - len(last) - 1
    segment.write_bytes(data[: start + len(last) // 2])  # half of the last entry's line
    stream, entry_id = orjson.loads(last)["stream"], orjson.loads(last)["id"]
    redis_client.xgroup_setid(stream, RECEIPTS_GROUP, "0")
    worker = archive_all(redis_client, tmp_path)
    assert worker.stats.archived == 1
    assert_exactly_once(redis_client, tmp_path)
    assert audit_archive(tmp_path, KEYS).ok
    assert entry_id in {r.get("id") for _, r in read_archive(tmp_path)}


def test_segments_rotate_by_size_compress_when_closed_and_replay_reads_them_all(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    run_in_harness(redis_client, 30)
    archive_all(redis_client, tmp_path, batch_size=50, segment_bytes=20_000, compress=True)
    packed = sorted(tmp_path.glob("segment-*.jsonl.gz"))
    assert len(packed) >= 3 and len(list(tmp_path.glob("segment-*.jsonl"))) == 1
    assert_exactly_once(redis_client, tmp_path)
    report = audit_archive(tmp_path, KEYS, client=redis_client)
    assert report.ok, report.first_problem


def test_a_second_worker_on_the_same_archive_is_refused(tmp_path: Path) -> None:
    sink = SegmentSink(tmp_path)
    try:
        SegmentSink(tmp_path)
    except Exception as error:  # noqa: BLE001 - checking the message
        assert "another receipts worker holds it" in str(error)
    else:
        raise AssertionError("two sinks opened one archive")
    finally:
        sink.close()


def test_task_kinds_that_appear_while_running_are_archived_too(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    harness = Harness(redis_client, KEYS)
    sink = SegmentSink(tmp_path)
    worker = ReceiptsWorker(redis_client, sink, KEYS, block_ms=20, rescan_every=0.0)
    harness.submit(compile_text("A"), {}, "one")
    harness.pump(lambda call: call.input)
    worker.run(idle_timeout=0.2)
    harness.submit(compile_text("ml:train → B"), {}, "two")  # a new kind: ml
    harness.pump(lambda call: call.input)
    worker.run(idle_timeout=0.2)
    sink.close()
    assert KEYS.tasks("ml") in worker.streams
    assert_exactly_once(redis_client, tmp_path)


def test_trimming_keeps_only_what_a_group_still_needs_and_the_archive_stays_complete(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    run_in_harness(redis_client, 20)
    sink = SegmentSink(tmp_path)
    worker = ReceiptsWorker(redis_client, sink, KEYS, block_ms=20, trim_every=0.0)
    # A stream whose engine group does not exist yet is never trimmed.
    start_workflow(redis_client, compile_text("orphan:task"), {}, "orphan")
    worker.run(idle_timeout=0.3)
    worker.run(idle_timeout=0.1)  # one more turn: trim after the last acknowledgement
    sink.close()
    # XTRIM MINID keeps the bound itself: each group's last-delivered entry stays.
    assert redis_client.xlen(KEYS.tasks("default")) == 1
    last = redis_client.xrevrange(KEYS.lifecycle, count=1)[0][1]
    assert redis_client.xlen(KEYS.lifecycle) == 2 and b"orphan" in last[b"workflow"]
    assert worker.stats.trimmed > 0
    assert_exactly_once(redis_client, tmp_path)


@pytest.mark.parametrize("trim_after", [10, 10**9])
def test_a_stream_is_trimmed_once_trim_after_of_its_entries_were_archived(
    redis_client: redis.Redis, tmp_path: Path, trim_after: int
) -> None:
    run_in_harness(redis_client, 20)
    before = redis_client.xlen(KEYS.lifecycle)
    sink = SegmentSink(tmp_path)
    # The interval's trim comes first, with nothing archived yet; the next is an hour on.
    worker = ReceiptsWorker(
        redis_client, sink, KEYS, block_ms=20, trim_every=3600.0, trim_after=trim_after
    )
    worker.run(idle_timeout=0.3)
    sink.close()
    if trim_after == 10:
        assert redis_client.xlen(KEYS.lifecycle) <= 2 < before
        assert redis_client.xlen(KEYS.tasks("default")) <= 2
    else:
        assert redis_client.xlen(KEYS.lifecycle) == before
    assert_exactly_once(redis_client, tmp_path)


def test_a_pack_counts_towards_trim_after_by_its_size_not_as_one_entry(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    harness = Harness(redis_client, KEYS, pack_starts=True)
    graph = compile_text("A → B → C")
    for n in range(20):
        harness.submit(graph, {"n": n, "pad": "x" * 200}, f"p{n}")
    harness.pump(lambda call: call.input)  # three packs of 20 tasks on the task stream
    packs = redis_client.xlen(KEYS.tasks("default"))
    assert packs == 3
    sink = SegmentSink(tmp_path)
    # Fewer entries than trim_after, but far more tasks: trimmed by the count, not the hour.
    worker = ReceiptsWorker(
        redis_client, sink, KEYS, block_ms=20, trim_every=3600.0, batch_size=1, trim_after=10
    )
    worker.run(idle_timeout=0.3)
    sink.close()
    assert redis_client.xlen(KEYS.tasks("default")) < packs
    assert_exactly_once(redis_client, tmp_path)


def _add_odd_entries(client: redis.Redis) -> str:
    """Entries the fast path must leave to the decoding path, in a task stream of their
    own: values that are not JSON on their own (one pair that would be, joined), JSON
    with a line break or carriage return, repeated and non-UTF-8 field names; plus JSON
    spelt unusually (kept as written)."""
    client.sadd(KEYS.kinds, "odd")
    stream = KEYS.tasks("odd")
    for fields in [
        {"kind": b'"start-task"', "text": b"hello"},
        {"a": b'{"x":1', "b": b'2},"b":3'},  # not JSON alone; '{"a":…,"b":…}' would parse
        {"a": b"[1", "b": b'2],"b":3'},
        {"n": b"NaN", "m": b"-Infinity"},
        {"w": b"1\n", "kind": b'"x"'},
        {"w": b'\r"x"', "kind": b'"x"'},  # bytes.splitlines would split the line there
        {b"\xff": b"1", "kind": b'"x"'},
        {
            "big": b"18446744073709551616",
            "e": b'"\\u00e9\\t"',
            "f": b"1E2",
            "s": b' { "k" : [1] } ',
        },
    ]:
        client.xadd(stream, fields)
    client.execute_command("XADD", stream, "*", "a", "1", "b", "2", "a", "3")
    return stream


@pytest.mark.parametrize("protocol", [2, 3, None])
def test_archived_events_read_back_as_the_decoded_ones_and_engine_lines_are_unchanged(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path, protocol: int | None
) -> None:
    run_in_harness(redis_client, 5)
    odd = _add_odd_entries(redis_client)
    # The worker's raw XREADGROUP reply is shaped by the protocol (RESP2 lists, RESP3 maps).
    client = redis.Redis.from_url(redis_url, protocol=protocol)
    try:
        archive_all(client, tmp_path)
        # An entry deleted while pending (a restart's XAUTOCLAIM would drop it from the
        # pending list, so read it as the running worker reads its own pending entries).
        doomed = client.xadd(odd, {"kind": b'"start-task"'}).decode()
        client.xreadgroup(RECEIPTS_GROUP, "receipts", {odd: ">"})
        client.xdel(odd, doomed)
        sink = SegmentSink(tmp_path)
        worker = ReceiptsWorker(client, sink, KEYS, trim_every=None)
        assert worker._read_pending(odd) == 1
        sink.close()
        assert worker.stats.gone == 1
        lines = list(read_archive(tmp_path))
        findings, _ = check_chain(lines)
        assert not findings
        entries = {
            (stream, i.decode()): fields
            for stream in engine_streams(client)
            for i, fields in client.xrange(stream)
        }
        checked = graphs = 0
        for line, record in lines:
            if "graph" in record:
                graphs += 1
            if "stream" not in record:
                continue
            assert record.keys() - {"raw"} == {
                "seq",
                "stream",
                "id",
                "event" if "event" in record else "gone",
            }
            if record["id"] == doomed:
                assert record["stream"] == odd and record["gone"] is True
                continue
            fields = entries[record["stream"], record["id"]]
            flat = [x for pair in fields.items() for x in pair]
            event, raw = expected_fields(flat)
            assert record["event"] == event
            assert {name: raw_value(record, name) for name in record.get("raw", {})} == raw
            if record["stream"] != odd:  # written by the engine: the same bytes as before
                before = {k: v for k, v in record.items() if k != "event"}
                before["event"] = {n.decode(): orjson.loads(v) for n, v in fields.items()}
                assert line == orjson.dumps(before)
            checked += 1
        assert checked == len(entries) and graphs == 1
        first_start = next(
            n
            for n, (_, r) in enumerate(lines)
            if r.get("event", {}).get("kind") == "start-workflow"
        )
        assert "graph" in lines[first_start - 1][1]
        assert_exactly_once(client, tmp_path)
    finally:
        client.close()


def test_a_sink_without_write_encoded_receives_events_as_dicts(
    redis_client: redis.Redis,
) -> None:
    class ListSink:
        def __init__(self) -> None:
            self.records: list[dict[str, Any]] = []

        def last_ids(self) -> dict[str, str]:
            return {}

        def has_graph(self, digest: str) -> bool:
            return any(r.get("graph") == digest for r in self.records)

        def write(self, batch: list[dict[str, Any]]) -> None:
            self.records.extend(batch)

        def flush(self) -> None:
            pass

        def close(self) -> None:
            pass

    run_in_harness(redis_client, 3)
    sink = ListSink()
    ReceiptsWorker(redis_client, sink, KEYS, block_ms=20, trim_every=None).run(idle_timeout=0.2)
    events = [r["event"] for r in sink.records if "event" in r]
    assert events and all(type(e) is dict for e in events)
    assert {e["kind"] for e in events} >= {"start-workflow", "start-task", "end-task"}


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [
        ("--trim-after", "0", "0 is below 1"),
        ("--trim-after", "many", "'many' is not a whole number"),
        ("--batch-size", "-1", "-1 is below 1"),
        ("--trim-interval", "0", "expected more than 0 and finite"),
        ("--trim-interval", "inf", "expected more than 0 and finite"),
    ],
)
def test_the_receipts_command_refuses_a_count_or_interval_out_of_range_in_one_line(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, why: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["receipts", flag, value])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {flag}: " in error and error.endswith(why)


def test_a_receipts_worker_refuses_to_trim_after_fewer_than_one_entry(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="trim_after must be 1 or more"):
        ReceiptsWorker(redis_client, SegmentSink(tmp_path), KEYS, trim_after=0)
