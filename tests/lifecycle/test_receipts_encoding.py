"""The receipts worker's encoded lines: built from the entries' own bytes, they must read
back as decoding the entries would, and be byte for byte what orjson would write for an
engine entry. No Redis here: replies are made up as hiredis returns them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lifecycle.audit.archive import all_plain as _all_plain
from lifecycle.audit.archive import check_values, line_hash, raw_value, read_archive
from lifecycle.audit.archive import joined_values as _joined
from lifecycle.audit.receipts import ReceiptsWorker
from lifecycle.audit.segments import SegmentSink
from lifecycle.audit.verify import check_chain
from tests.lifecycle.archive_oracle import expected_fields

# CI's size; RECEIPTS_ENCODING_EXAMPLES=20000 (with -o timeout=0) for the full one.
EXAMPLES = int(os.environ.get("RECEIPTS_ENCODING_EXAMPLES", "200"))
hypothesis_settings = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

text = st.text(max_size=6)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
canonical = json_values.map(orjson.dumps)  # as the engine writes its values
# JSON tokens and pieces of them: joined at random they make values that are JSON on
# their own, values that are not, and values that are only JSON once joined to others.
tokens = st.sampled_from(
    [b"1", b"-0", b"0", b"2.5e3", b"null", b"true", b"false", b'"a"', b'"nu', b'll"']
    + [b'"\\u006eull"']
    + [b",", b":", b"[", b"]", b"{", b"}", b'"', b"\\", b" ", b"\t", b"\n", b"\r", b"\xff"]
)
fragments = st.lists(tokens, max_size=6).map(b"".join)
odd_spellings = st.sampled_from(
    [b" 1 ", b"1E2", b"1.0", b'"\\u00e9\\t"', b'"\\/"', b"18446744073709551616", b"NaN", b""]
)
values = canonical | fragments | odd_spellings | st.binary(max_size=8)
names = text.map(str.encode) | st.sampled_from([b"kind", b"graph", b"\xff", b"%s", b'"'])


def _reply(stream: bytes, entries: list[list[Any]]) -> list[Any]:
    """An XREAD reply as hiredis gives it (RESP2): [[stream, [[id, fields], ...]]]."""
    return [[stream, entries]]


class _NoGraphs:
    """The client the worker asks for a start-workflow's graph: it has none."""

    def get(self, key: str) -> None:
        return None


def _archive(stream: str, entries: list[list[Any]], directory: Path) -> list[tuple[bytes, Any]]:
    """Every line of the archive the worker makes of one reply holding ``entries``."""
    sink = SegmentSink(directory)
    worker = ReceiptsWorker(_NoGraphs(), sink, trim_every=None)  # type: ignore[arg-type]
    # The worker may keep the lists hiredis hands it: give it copies, keep the originals.
    copies = [[entry_id, list(fields) if fields else fields] for entry_id, fields in entries]
    worker._archive(_reply(stream.encode(), copies))
    sink.close()
    return list(read_archive(directory))


def _engine(fields: list[bytes]) -> bool:
    """As the engine writes an entry: distinct UTF-8 names, values as orjson spells them."""
    try:
        names_ = [name.decode() for name in fields[0::2]]
        values_ = fields[1::2]
        return len(set(names_)) == len(names_) and values_ == list(
            map(orjson.dumps, map(orjson.loads, values_))
        )
    except (UnicodeDecodeError, orjson.JSONDecodeError):
        return False


def _check(stream: str, entries: list[list[Any]], lines: list[tuple[bytes, Any]]) -> None:
    """The chain holds; after the checkpoint, one line per entry (none broken in two), each
    reading back as the decoded entry, and an engine entry's the bytes orjson writes;
    then the batch's seal."""
    assert not check_chain(lines)[0]
    assert "adler32" in lines[-1][1]
    lines = lines[1:-1]
    assert len(lines) == len(entries)
    for (entry_id, fields), (line, record) in zip(entries, lines, strict=True):
        assert record["stream"] == stream and record["id"] == entry_id.decode()
        if fields is None:
            assert record["gone"] is True
            continue
        event, raw = expected_fields(fields)
        assert record["event"] == event
        assert {name: raw_value(record, name) for name in record.get("raw", {})} == raw
        if _engine(fields):
            head = {key: record[key] for key in ("seq", "stream", "id")}
            assert line == orjson.dumps({**head, "event": event})


@hypothesis_settings
@given(
    stream=st.text(min_size=1, max_size=6),
    shapes=st.lists(st.lists(names, min_size=1, max_size=4), min_size=1, max_size=3),
    rows=st.lists(
        st.tuples(st.integers(0, 2), st.lists(values, min_size=4, max_size=4) | st.none()),
        min_size=1,
        max_size=12,
    ),
)
@example(stream="s", shapes=[[b"a", b"b", b"c"]], rows=[(0, [b"1,null,[2", b"3]", b"4", b"5"])])
@example(
    stream="%", shapes=[[b"kind", b"graph"]], rows=[(0, [b'"start-workflow"', b'"g"', b"", b""])]
)
def test_encoded_lines_read_back_as_the_decoded_events_and_engine_lines_as_orjson_writes_them(
    stream: str, shapes: list[list[bytes]], rows: list[tuple[int, list[bytes] | None]]
) -> None:
    entries: list[list[Any]] = []
    for number, (shape, row) in enumerate(rows):
        names_ = shapes[shape % len(shapes)]
        fields = (
            None if row is None else [x for pair in zip(names_, row, strict=False) for x in pair]
        )
        entries.append([b"1700000000000-%d" % number, fields])
    with tempfile.TemporaryDirectory() as directory:
        _check(stream, entries, _archive(stream, entries, Path(directory)))


def test_entries_checked_a_chunk_at_a_time_each_read_back_as_decoded(tmp_path: Path) -> None:
    # 300 entries: chunks of 128, one of them holding a null (checked entry by entry),
    # one a value that is not JSON alone, one a line break.
    entries: list[list[Any]] = []
    for number in range(300):
        output = b'{"n":%d}' % number
        if number == 5:
            output = b'{"n":null}'
        elif number == 140:
            output = b'{"n":1'
        elif number == 290:
            output = b'{"n":\n1}'
        fields = [b"kind", b'"end-task"', b"workflow", b'"w%d"' % number, b"output", output]
        entries.append([b"1700000000000-%d" % number, fields])
    lines = _archive("{flow}:lifecycle", entries, tmp_path)
    _check("{flow}:lifecycle", entries, lines)
    assert raw_value(lines[1 + 140][1], "output") == b'{"n":1'  # kept raw, exact
    assert "output" not in lines[1 + 140][1]["event"]
    assert lines[1 + 290][1]["event"]["output"] == {"n": 1}


def _lists_of(values_: list[bytes]) -> list[list[bytes] | None]:
    """The values as entries' value lists: two to an entry, and a deleted entry."""
    return [values_[at : at + 2] for at in range(0, len(values_), 2)] + [None]


def _each_plain(values_: list[bytes]) -> bool:
    try:
        for value in values_:
            orjson.loads(value)
    except orjson.JSONDecodeError:
        return False
    return not any(b"\n" in value or b"\r" in value for value in values_)


@settings(max_examples=10 * EXAMPLES, deadline=None)
@given(st.lists(fragments | canonical, max_size=6))
@example([b"1,null,[2", b"3]", b"4"])  # joined: [1,null,[2\n,null,3]\n,null,4] has 5 elements
@example([b"[1", b"2]"])
@example([b'"a', b'b"'])
@example([b'"\\u006eull"', b"1"])  # "null" spelt with an escape: a string, not a separator
@example([b"1,0,[2", b"3]", b"null"])  # with false between: [1,0,[2,false,3],false,null]
def test_values_checked_at_once_only_when_each_is_json_on_its_own(values_: list[bytes]) -> None:
    for separator in (b"null", b"false", b"true"):
        if _all_plain(*_joined(_lists_of(values_), separator), separator):
            assert _each_plain(values_)
    checked, _, _ = check_values(_lists_of(values_))
    if checked:
        assert _each_plain(values_)


@pytest.mark.parametrize(("separator", "number"), [(b"false", b"0"), (b"true", b"1.0")])
def test_a_number_equal_to_a_boolean_separator_does_not_pass_for_one(
    separator: bytes, number: bytes
) -> None:
    # Joined: [1,0,[2,false,3],false,4], parsed [1, 0, [2, False, 3], False, 4]: five
    # elements, and 0 == False, yet "1,0,[2" is no JSON value on its own.
    values_ = [b"1," + number + b",[2", b"3]", b"4"]
    text, count = _joined(_lists_of(values_), separator)
    assert text.count(separator) == count - 1
    assert not _all_plain(text, count, separator)


@pytest.mark.parametrize(
    "values_",
    [
        [b'"start-task"', b'"w1"', b"1", b'{"n":1}', b"{}", b"[1,[2,{}]]"],
        [b" 1 ", b"\t2", b'"\\u00e9"', b"1E2", b"true", b"false"],
        [b'"no separators here"'],
    ],
)
def test_values_each_json_on_their_own_are_checked_at_once(values_: list[bytes]) -> None:
    assert _all_plain(*_joined(_lists_of(values_)))


@pytest.mark.parametrize(
    "values_",
    [[b"null"], [b'"nullable"'], [b"1\n"], [b"1\r"], [b"1", b"2,3"], [b"[1", b"2]"]],
)
def test_values_not_checked_at_once_when_they_hold_null_a_line_break_or_are_not_json(
    values_: list[bytes],
) -> None:
    assert not _all_plain(*_joined(_lists_of(values_)))


def test_values_holding_null_are_checked_at_once_with_false_or_true_between_them() -> None:
    assert check_values(_lists_of([b'{"x":null}', b"1"]))[:2] == (True, True)
    assert check_values(_lists_of([b"[null,false]", b"1"]))[:2] == (True, True)
    assert check_values(_lists_of([b"[null,false,true]", b"1"]))[:2] == (False, False)
    assert check_values(_lists_of([b'{"x":null}', b"1,2"]))[:2] == (False, False)


def test_write_encoded_lines_equal_the_dict_records_lines_and_a_failed_batch_keeps_the_chain(
    tmp_path: Path,
) -> None:
    record = {"stream": "s%", "id": "1-0", "event": {"kind": "x", "n": 1}}
    encoded = orjson.dumps(record)[1:]
    plain, fast = SegmentSink(tmp_path / "plain"), SegmentSink(tmp_path / "fast")
    plain.write([record, {"graph": "g", "text": "{}"}, {**record, "id": "1-1"}])
    fast.write_encoded(
        [encoded, {"graph": "g", "text": "{}"}, encoded.replace(b"1-0", b"1-1")], {"s%": "1-1"}
    )
    with pytest.raises(TypeError):  # a record orjson cannot write: nothing of it is kept
        fast.write_encoded([encoded, {"graph": object()}], {"s%": "2-0"})
    assert fast.last_ids() == {}  # nothing counts before a flush
    fast.flush()
    assert fast.last_ids() == {"s%": "1-1"}
    fast.write_encoded([encoded.replace(b"1-0", b"2-0")], {"s%": "2-0"})
    plain.write([{**record, "id": "2-0"}])
    for sink in (plain, fast):
        sink.close()
    assert (tmp_path / "plain" / "segment-000000000000.jsonl").read_bytes() == (
        tmp_path / "fast" / "segment-000000000000.jsonl"
    ).read_bytes()
    lines = list(read_archive(tmp_path / "fast"))
    assert not check_chain(lines)[0]
    # The last seal's prev: the sha256 of the lines since the seal before it, that one
    # included, joined by their newlines.
    assert "adler32" in lines[-3][1] and "adler32" in lines[-1][1]
    assert lines[-1][1]["prev"] == line_hash(lines[-3][0] + b"\n" + lines[-2][0])
    reopened = SegmentSink(tmp_path / "fast")
    assert reopened.last_ids() == {"s%": "2-0"} and reopened.has_graph("g")
    reopened.close()


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_a_value_too_deep_for_a_line_is_kept_raw_and_no_entry_after_it_is_lost(
    tmp_path: Path,
) -> None:
    # 1,023 levels parse on their own but not two levels down in a line (orjson reads
    # 1,024): copied as is, the line would be unreadable, and reopening the archive
    # would cut it and every entry after it.
    deep = _nested(1023)
    entries: list[list[Any]] = [
        [b"1-%d" % number, [b"kind", b'"end-task"', b"output", output]]
        for number, output in enumerate([b"1", deep, _nested(300), b"2", deep + b" "])
    ]
    lines = _archive("{flow}:lifecycle", entries, tmp_path)
    outputs = [r["event"].get("output", raw_value(r, "output")) for _, r in lines[1:-1]]
    assert outputs == [1, deep, _nested(300), 2, deep + b" "]
    reopened = SegmentSink(tmp_path)
    assert reopened.last_ids() == {"{flow}:lifecycle": "1-4"}
    reopened.close()
    assert len(list(read_archive(tmp_path))) == len(lines)


@pytest.mark.parametrize(
    "value",
    [b'"\\ud800"', b"1" + b"0" * 400, _nested(300)],
    ids=["lone-surrogate", "integer-past-64-bits", "deeper-than-orjson-writes"],
)
@pytest.mark.parametrize("encoded", [True, False], ids=["segment-sink", "dict-sink"])
def test_a_value_an_archive_line_cannot_hold_as_json_is_kept_raw_and_exact(
    tmp_path: Path, value: bytes, encoded: bool
) -> None:
    # A name that is not UTF-8 sends the entry down the decoding path.
    entries: list[list[Any]] = [
        [b"1-0", [b"kind", b'"end-task"', b"\xff", b"1", b"output", value]],
        [b"1-1", [b"kind", b'"end-task"', b"output", b"2"]],
    ]
    if encoded:
        records = [record for _, record in _archive("s", entries, tmp_path)[1:]]
    else:

        class JsonLinesSink:  # as a custom sink would write records: one JSON line each
            def __init__(self) -> None:
                self.lines: list[bytes] = []

            def last_ids(self) -> dict[str, str]:
                return {}

            def has_graph(self, digest: str) -> bool:
                return False

            def write(self, batch: list[dict[str, Any]]) -> None:
                self.lines += [orjson.dumps(record) for record in batch]

            def flush(self) -> None:
                pass

        sink = JsonLinesSink()
        ReceiptsWorker(_NoGraphs(), sink, trim_every=None)._archive(_reply(b"s", entries))  # type: ignore[arg-type]
        records = [orjson.loads(line) for line in sink.lines]
    assert raw_value(records[0], "output") == value and "output" not in records[0]["event"]
    assert records[1]["event"]["output"] == 2 and "raw" not in records[1]
    assert raw_value(records[0], "\\xff") == b"1"  # a name that is not UTF-8, escaped


def test_segments_smaller_than_their_checkpoint_rotate_once_per_flush(tmp_path: Path) -> None:
    sink = SegmentSink(tmp_path, segment_bytes=1)
    for number in range(3):
        sink.write([{"stream": "s", "id": f"1-{number}", "event": {"n": number}}])
        sink.flush()
    sink.close()
    lines = list(read_archive(tmp_path))
    assert not check_chain(lines)[0]
    assert [record["id"] for _, record in lines if "id" in record] == ["1-0", "1-1", "1-2"]
    assert len(list(tmp_path.glob("segment-*"))) == 4  # each flush opens the next


def test_a_torn_last_line_is_dropped_on_opening_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = SegmentSink(tmp_path)
    sink.write([{"stream": "s", "id": "1-0", "event": {"n": 0}}])
    sink.close()
    (segment,) = tmp_path.glob("segment-*")
    with open(segment, "ab") as file:
        file.write(b'{"seq":3,"prev":"ab')  # a crash in the middle of a write
    with caplog.at_level("WARNING", logger="lifecycle.audit.segments"):
        reopened = SegmentSink(tmp_path)
    assert reopened.last_ids() == {"s": "1-0"}
    reopened.close()
    assert "jsonl:4: dropping an incomplete final line (19 bytes" in caplog.text
    ids = [record.get("id") for _, record in read_archive(tmp_path)]
    assert ids == [None, "1-0", None]  # checkpoint, entry, seal
