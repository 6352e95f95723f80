"""The archive's files and reader: evidence kept on opening, private modes, a streaming
reader that reports bad lines instead of raising. Real files in tmp_path, no Redis."""

from __future__ import annotations

import gzip
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from lifecycle.audit.archive import (
    ArchivedEvent,
    ArchiveError,
    ArchiveProblem,
    entry_record,
    iter_archive,
    line_hash,
    raw_value,
    read_archive,
)
from lifecycle.audit.segments import SegmentSink
from lifecycle.audit.verify import check_chain


def _entries(sink: SegmentSink, stream: str, first: int, count: int) -> None:
    for number in range(first, first + count):
        sink.write([{"stream": stream, "id": f"1-{number}", "event": {"n": number}}])
        sink.flush()


def _archive(directory: Path, count: int = 5) -> Path:
    sink = SegmentSink(directory)
    _entries(sink, "s", 0, count)
    sink.close()
    (segment,) = directory.glob("segment-*.jsonl")
    return segment


def _corrupt(segment: Path, number: int, garbage: bytes = b"#garbage#") -> bytes:
    """Replace line ``number`` (from 1) by ``garbage``, newline kept; returns the file."""
    lines = segment.read_bytes().split(b"\n")
    lines[number - 1] = garbage
    data = b"\n".join(lines)
    segment.write_bytes(data)
    return data


def test_a_corrupt_middle_line_is_kept_and_reported_once_with_file_and_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    segment = _archive(tmp_path)  # checkpoint, then each entry and its batch's seal
    before = _corrupt(segment, 4)  # entry 1-1
    with caplog.at_level("WARNING", logger="lifecycle.audit.segments"):
        sink = SegmentSink(tmp_path)
    assert segment.read_bytes() == before  # nothing cut: the evidence stays
    reports = [r.getMessage() for r in caplog.records if "evidence" in r.getMessage()]
    assert len(reports) == 1 and f"{segment}:4: not JSON" in reports[0]
    assert len(sink.problems) == 1 and sink.problems[0].startswith(f"{segment.name}:4: not JSON")
    # The archive goes on after it: the last ids come from the lines after the bad one.
    assert sink.last_ids() == {"s": "1-4"}
    _entries(sink, "s", 5, 2)
    sink.close()
    assert segment.read_bytes().startswith(before)
    items = list(iter_archive(tmp_path))
    problems = [i for i in items if isinstance(i, ArchiveProblem)]
    assert [(p.file, p.line) for p in problems] == [(segment.name, 4)]
    records = [i for i in items if isinstance(i, ArchivedEvent)]
    assert [r.seq for r in records] == [0, 1, 2, *range(4, 15)]  # seq 3 is the corrupt line's
    # New records chain on from the last seal; the check flags the corrupt line alone.
    seal, entry, next_seal = records[9:12]
    assert next_seal.record["prev"] == line_hash(seal.line + b"\n" + entry.line)
    findings, _ = check_chain([(r.line, r.record) for r in records])
    assert len(findings) == 1 and "record 3 is missing" in str(findings[0])


def test_a_corrupt_last_complete_line_is_kept_and_the_chain_continues_through_it(
    tmp_path: Path,
) -> None:
    segment = _archive(tmp_path, 3)
    before = _corrupt(segment, 7, b'{"seq":6,"prev":"broken')  # the last seal; not torn
    sink = SegmentSink(tmp_path)
    assert segment.read_bytes() == before and len(sink.problems) == 1
    _entries(sink, "s", 3, 1)
    sink.close()
    last = list(iter_archive(tmp_path))[-1]
    assert isinstance(last, ArchivedEvent) and last.seq == 8
    # The new seal covers what follows the last good seal: the corrupt line included.
    lines = segment.read_bytes().split(b"\n")
    assert lines[6] == b'{"seq":6,"prev":"broken'
    assert last.record["prev"] == line_hash(b"\n".join(lines[4:8]))


def test_a_corrupt_checkpoint_takes_the_state_from_the_previous_segment(tmp_path: Path) -> None:
    sink = SegmentSink(tmp_path, segment_bytes=200)
    _entries(sink, "s", 0, 4)
    _entries(sink, "t", 0, 1)
    sink.close()
    segments = sorted(tmp_path.glob("segment-*.jsonl"))
    assert len(segments) >= 3
    _corrupt(segments[-1], 1)
    reopened = SegmentSink(tmp_path, segment_bytes=200)
    assert reopened.last_ids() == {"s": "1-3", "t": "1-0"}
    reopened.close()


def test_only_an_incomplete_final_line_is_dropped_on_opening(tmp_path: Path) -> None:
    segment = _archive(tmp_path, 2)
    corrupt = _corrupt(segment, 2)
    segment.write_bytes(corrupt + b'{"seq":3,"pre')  # torn after a corrupt line
    sink = SegmentSink(tmp_path)
    sink.close()
    assert segment.read_bytes() == corrupt


def test_a_flush_refused_by_a_full_device_is_retried_from_the_last_durable_byte(
    tmp_path: Path,
) -> None:
    # /dev/full answers every write with ENOSPC: a real OS error, on the sink's own fd.
    sink = SegmentSink(tmp_path)
    _entries(sink, "s", 0, 2)
    durable = next(tmp_path.glob("segment-*.jsonl")).read_bytes()
    assert sink._fd is not None
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, sink._fd)
    os.close(full)
    sink.write([{"stream": "s", "id": "1-2", "event": {"n": 2}}])
    with pytest.raises(ArchiveError, match=r"archive disk full at .*segment-0+\.jsonl$"):
        sink.flush()
    assert sink.last_ids() == {"s": "1-1"}  # not archived until a flush succeeds
    sink.flush()  # reopens the segment: written once, after the durable bytes
    sink.close()
    data = next(tmp_path.glob("segment-*.jsonl")).read_bytes()
    assert data.startswith(durable) and data.count(b'"id":"1-2"') == 1
    assert not check_chain(list(read_archive(tmp_path)))[0]


def test_closing_with_a_refused_flush_drops_the_batch_and_raises_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = SegmentSink(tmp_path)
    _entries(sink, "s", 0, 1)
    assert sink._fd is not None
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, sink._fd)
    os.close(full)
    sink.write([{"stream": "s", "id": "1-1", "event": {"n": 1}}])
    with pytest.raises(ArchiveError, match="archive disk full"):
        sink.flush()  # refused: the segment is closed until the next try
    (segment,) = tmp_path.glob("segment-*.jsonl")
    segment.unlink()  # so that the next try is refused too: the segment is gone
    sink.close()  # one more try: refused, logged, not raised
    assert caplog.text.count("archive segment missing at") == 1
    assert caplog.text.count("not archived, read again at the next start") == 1


@pytest.fixture
def umask(request: pytest.FixtureRequest) -> Iterator[None]:
    previous = os.umask(request.param)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077], indirect=True)
def test_archive_files_are_0600_and_directories_0700_whatever_the_umask(
    tmp_path: Path, umask: None
) -> None:
    directory = tmp_path / "a" / "b"
    sink = SegmentSink(directory, segment_bytes=150, compress=True)
    _entries(sink, "s", 0, 4)
    sink.close()
    for path in (tmp_path / "a", directory):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    files = list(directory.iterdir())
    assert any(p.name.endswith(".gz") for p in files) and len(files) >= 3
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_iter_archive_reports_bad_lines_and_reads_on_across_gzip_segments(
    tmp_path: Path,
) -> None:
    sink = SegmentSink(tmp_path, segment_bytes=150, compress=True)
    _entries(sink, "s", 0, 4)
    sink.close()
    packed = sorted(tmp_path.glob("*.gz"))[0]
    lines = gzip.decompress(packed.read_bytes()).split(b"\n")
    lines.insert(1, b"[1, 2]")
    packed.write_bytes(gzip.compress(b"\n".join(lines)))
    plain = next(tmp_path.glob("segment-*.jsonl"))
    plain.write_bytes(plain.read_bytes() + b'{"seq":')
    items = list(iter_archive(tmp_path))
    problems = [str(i) for i in items if isinstance(i, ArchiveProblem)]
    torn_at = plain.read_bytes().count(b"\n") + 1
    assert problems == [
        f"{packed.name}:2: not a JSON object",
        f"{plain.name}:{torn_at}: incomplete final line (torn write)",
    ]
    ids = [i.id for i in items if isinstance(i, ArchivedEvent) and i.stream]
    assert ids == ["1-0", "1-1", "1-2", "1-3"]
    with pytest.raises(ArchiveError, match=r"segment-0+\.jsonl\.gz:2: not a JSON object"):
        list(read_archive(tmp_path))


def test_iter_archive_skips_a_line_longer_than_its_bound_without_holding_it(
    tmp_path: Path,
) -> None:
    segment = _archive(tmp_path, 2)
    lines = segment.read_bytes().split(b"\n")
    lines.insert(2, b"x" * 5000)
    segment.write_bytes(b"\n".join(lines))
    items = list(iter_archive(tmp_path, max_line=1000))
    assert str(items[2]) == f"{segment.name}:3: line longer than 1,000 bytes"
    assert [type(i).__name__ for i in items] == [
        "ArchivedEvent",
        "ArchivedEvent",
        "ArchiveProblem",
        *["ArchivedEvent"] * 3,  # the first seal, the second entry and its seal
    ]


def test_iter_archive_of_a_missing_directory_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="no such archive directory"):
        next(iter_archive(tmp_path / "nope"))


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"{bad", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "too deep for any parser's recursion"),
        (b"[" * 300 + b"]" * 300, "deeper than the limit"),
        (b"1" * 30, "an integer past 64 bits"),
        (b"-9223372036854775809", "below the smallest 64-bit integer"),
        (b'"\xff\xfe"', "not UTF-8"),
        (b'"\\ud800"', "a lone surrogate"),
        (b"", "empty"),
    ],
)
def test_an_undecodable_value_is_archived_raw_and_exact(value: bytes, why: str) -> None:
    record = entry_record(
        "s", "1-0", [b"kind", b'"x"', b"v", value, b"big", b"18446744073709551615"]
    )
    assert raw_value(record, "v") == value, why
    assert record["event"] == {"kind": "x", "big": 18446744073709551615}


def test_nan_and_a_name_that_is_not_utf8_follow_the_documented_forms() -> None:
    record = entry_record("s", "1-0", [b"n", b"NaN", b"\xffx", b"1", b"n2", b"[Infinity]"])
    assert record["event"] == {"n": None, "n2": [None]}  # as the engine's encoder writes them
    assert record["raw"] == {"\\xffx": "MQ=="}


def test_a_segment_found_twice_after_a_crash_keeps_its_original_unless_the_copy_is_whole(
    tmp_path: Path,
) -> None:
    for name, damage in [("whole", False), ("cut", True)]:
        directory = tmp_path / name
        sink = SegmentSink(directory, segment_bytes=150, compress=True)
        _entries(sink, "s", 0, 3)
        sink.close()
        packed = sorted(directory.glob("*.gz"))[0]
        plain = packed.with_suffix("")
        original = gzip.decompress(packed.read_bytes())
        plain.write_bytes(original)  # as if killed between the rename and the unlink
        if damage:
            packed.write_bytes(packed.read_bytes()[:-20])
        SegmentSink(directory, segment_bytes=150, compress=True).close()
        assert plain.exists() == damage and packed.exists() != damage
        ids = [i.id for i in iter_archive(directory) if isinstance(i, ArchivedEvent) and i.id]
        assert ids == ["1-0", "1-1", "1-2"]
