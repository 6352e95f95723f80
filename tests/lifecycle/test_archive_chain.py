"""The archive's chain: a seal after each batch covers its lines with one sha256 and
locates a change with an Adler-32 per line; archives chaining every line still verify.
Real files in tmp_path, no Redis."""

from __future__ import annotations

import zlib
from pathlib import Path

import orjson

from lifecycle.audit.archive import GENESIS, line_hash, read_archive
from lifecycle.audit.segments import SegmentSink
from lifecycle.audit.verify import check_chain


def _batches(directory: Path, batches: int = 3, size: int = 4) -> list[bytes]:
    """An archive of ``batches`` batches of ``size`` entries; returns its lines."""
    sink = SegmentSink(directory)
    for batch in range(batches):
        sink.write(
            [
                {
                    "stream": "s",
                    "id": f"1-{batch * size + n}",
                    "event": {"kind": "probe", "n": batch * size + n},
                }
                for n in range(size)
            ]
        )
        sink.flush()
    sink.close()
    (segment,) = directory.glob("segment-*.jsonl")
    return segment.read_bytes().splitlines()


def _findings(lines: list[bytes]) -> list[str]:
    return [str(f) for f in check_chain([(line, orjson.loads(line)) for line in lines])[0]]


def test_each_batch_ends_with_a_seal_over_its_lines_and_an_intact_archive_verifies(
    tmp_path: Path,
) -> None:
    lines = _batches(tmp_path)
    records = [orjson.loads(line) for line in lines]
    seals = [n for n, r in enumerate(records) if "adler32" in r]
    assert seals == [5, 10, 15]  # the checkpoint, then four entries and a seal, thrice
    assert [r["seq"] for r in records] == list(range(16))
    # The second seal: the sha256 of the first seal and the four lines after it.
    assert records[10]["prev"] == line_hash(b"\n".join(lines[5:10]))
    assert records[10]["adler32"] == [zlib.adler32(line) for line in lines[6:10]]
    assert not any("prev" in r for r in records if "stream" in r)  # entries: no hash each
    assert _findings(lines) == []


def test_an_altered_entry_in_a_sealed_batch_is_named_by_its_seal(tmp_path: Path) -> None:
    lines = _batches(tmp_path)
    lines[7] = lines[7].replace(b'"n":5', b'"n":55')
    (finding,) = _findings(lines)
    assert finding.startswith("record 7 (s 1-5, probe) was altered")
    assert "record 10 (seal)" in finding


def test_an_altered_entry_whose_adler32_was_forged_too_is_still_caught_by_the_sha256(
    tmp_path: Path,
) -> None:
    lines = _batches(tmp_path)
    lines[7] = lines[7].replace(b'"n":5', b'"n":55')
    seal = orjson.loads(lines[10])
    seal["adler32"][1] = zlib.adler32(lines[7])
    lines[10] = orjson.dumps(seal)
    findings = _findings(lines)
    assert findings[0] == (
        "a record from record 5 (seal) to the one before record 10 (seal) was altered: "
        "their sha256 is not its prev"
    )
    assert len(findings) == 2  # the forged seal changed the next seal's lines too


def test_a_dropped_seal_and_a_dropped_entry_are_each_reported_missing(tmp_path: Path) -> None:
    lines = _batches(tmp_path)
    assert _findings(lines[:10] + lines[11:]) == [
        "record 10 is missing, before record 11 (s 1-8, probe)"
    ]
    assert _findings(lines[:7] + lines[8:]) == [
        "record 7 is missing, before record 8 (s 1-6, probe)"
    ]


def test_an_altered_seal_is_named_by_the_next_one(tmp_path: Path) -> None:
    lines = _batches(tmp_path)
    seal = orjson.loads(lines[5])
    seal["adler32"][0] += 1
    lines[5] = orjson.dumps(seal)
    findings = _findings(lines)
    assert findings[0].startswith("a record from record 5 (seal) to the one before record 10")


def _every_line_chained(count: int) -> list[bytes]:
    """An archive as written before seals: every record names the previous line's hash."""
    lines, prev = [], GENESIS
    records = [{"checkpoint": {"streams": {}, "graphs": []}}] + [
        {"stream": "s", "id": f"1-{n}", "event": {"n": n}} for n in range(count)
    ]
    for seq, record in enumerate(records):
        line = orjson.dumps({"seq": seq, "prev": prev, **record})
        lines.append(line)
        prev = line_hash(line)
    return lines


def test_an_archive_chaining_every_line_verifies_and_a_change_in_it_is_named(
    tmp_path: Path,
) -> None:
    lines = _every_line_chained(4)
    assert _findings(lines) == []
    lines[2] = lines[2].replace(b'"n":1', b'"n":11')
    assert _findings(lines) == [
        "record 2 (s 1-1, deleted entry) was altered: its sha256 is not the prev of record 3"
    ]


def test_a_sink_goes_on_with_seals_after_an_archive_chaining_every_line(tmp_path: Path) -> None:
    (tmp_path / "segment-000000000000.jsonl").write_bytes(
        b"\n".join(_every_line_chained(3)) + b"\n"
    )
    sink = SegmentSink(tmp_path)
    assert sink.last_ids() == {"s": "1-2"}
    sink.write([{"stream": "s", "id": "1-3", "event": {"n": 3}}])
    sink.close()
    records = [record for _, record in read_archive(tmp_path)]
    assert [r["seq"] for r in records] == list(range(6)) and "adler32" in records[-1]
    assert not check_chain(list(read_archive(tmp_path)))[0]
