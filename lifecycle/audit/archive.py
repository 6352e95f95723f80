"""The receipts archive's format: one line per record, chained by sha256 (docs/audit.md).

One record per line. Every record carries ``seq`` (0, 1, 2, ... over the whole
archive). A *chained* record also carries ``prev``: the sha256 of the archive's
bytes from the start of the previous chained record to the end of the line before
this one (its newline excluded; :data:`GENESIS` for the first). Entries and graphs
are not chained one by one (a hash per line was a fifth of the worker's time): the
seal after each batch covers them, so altering, dropping or reordering a record
breaks the chain at the next seal, and the seal's Adler-32 per line tells which
line changed. An archive chaining every line (as written before seals) reads and
verifies by the same rule. Kinds of record:

``{"seq", "prev", "checkpoint": {"streams": {stream: last id}, "graphs": [hash]}}``
    first line of every segment (chained): where the archive stood, so a restart
    reads one segment, not the whole archive;
``{"seq", "prev", "adler32": [checksum, ...]}``
    a seal, after each batch written (chained): ``adler32`` holds one Adler-32
    per line of the batch, the last one just before the seal; they only locate a
    change the seal's sha256 found (anyone can recompute them);
``{"seq", "stream", "id", "event"[, "raw"]}``
    one stream entry, its fields decoded. A value that does not decode within
    :data:`VALUE_LIMITS` (not JSON, not UTF-8, nested deeper than 256 levels,
    larger than 8 MiB, an integer past 64 bits, a lone surrogate) is not in
    ``event`` but in ``raw``: ``{field name: base64 of the value's bytes}``,
    exact, so nothing is lost and the worker goes on. A field name that is not
    UTF-8 is in ``raw`` too, its bad bytes written as ``\\xNN`` escapes.
    ``"gone": true`` and no event when the entry was deleted before it was read;
``{"seq", "graph", "text"}``
    a compiled graph's canonical JSON, archived before its first start-workflow.

:func:`entry_record` encodes one entry (the worker's fast path copies values as
written instead, in :mod:`lifecycle.audit.receipts`); :func:`decode_line` and
:func:`iter_archive` read records back. :class:`lifecycle.segments.SegmentSink`
writes the files; any class with the :class:`Sink` methods can replace it.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import json
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

import orjson

from flowlang.limits import DEFAULT_LIMITS, LimitExceeded, Limits, loads_value
from lifecycle.errors import LifecycleError
from rqse.events import has_long_digits

__all__ = [
    "GENESIS",
    "VALUE_LIMITS",
    "ArchiveError",
    "ArchiveProblem",
    "ArchivedEvent",
    "Chain",
    "Sink",
    "decode_line",
    "entry_record",
    "id_order",
    "iter_archive",
    "raw_value",
    "read_archive",
]

GENESIS = "0" * 64  # ``prev`` of record 0
_PREFIX, _PLAIN, _PACKED = "segment-", ".jsonl", ".jsonl.gz"
# An encoded record's line: what orjson.dumps({"seq": seq, **record}) spells.
ENCODED_LINE = b'{"seq":%d,%b'
# A seal's line: what orjson.dumps({"seq": seq, "prev": prev, "adler32": [...]}) spells.
SEAL_LINE = b'{"seq":%d,"prev":"%b","adler32":%b}'
# Values decoded into ``event``; the others go to ``raw``. flowlang's limits: a value
# the engine would refuse at its doors is kept exact rather than interpreted.
VALUE_LIMITS: Limits = DEFAULT_LIMITS
MAX_LINE_BYTES = 256 << 20  # a longer line is reported and skipped, not held in memory
_INT_RANGE = range(-(2**63), 2**64)  # what orjson reads and writes as an integer


class ArchiveError(LifecycleError):
    """Raised when an archive cannot be opened, read or written (one line, with the path)."""


def id_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable pair: ``"1700000000000-5"`` -> ``(1700000000000, 5)``."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def line_hash(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


class Chain:
    """The running hash a chained record's ``prev`` is checked against: the sha256 of
    the bytes from the last chained record read (included) to the last line read."""

    __slots__ = ("_hash",)

    def __init__(self) -> None:
        self._hash: Any = None  # None: no record yet, the next prev is GENESIS

    def copy(self) -> Chain:
        chain = Chain()
        chain._hash = None if self._hash is None else self._hash.copy()
        return chain

    @property
    def head(self) -> str:
        """The ``prev`` the next chained record must carry."""
        return GENESIS if self._hash is None else str(self._hash.hexdigest())

    def add(self, line: bytes, chained: bool) -> None:
        """Take one more line (without its newline); a chained one starts anew."""
        if chained or self._hash is None:
            self._hash = hashlib.sha256(line)
        else:
            self._hash.update(b"\n")
            self._hash.update(line)

    def add_lines(self, data: bytes) -> None:
        """Take lines of unchained records joined by newlines (one call for a batch)."""
        if self._hash is None:
            self._hash = hashlib.sha256(data)
        else:
            self._hash.update(b"\n")
            self._hash.update(data)


class Sink(Protocol):
    """Where the receipts worker writes. ``write`` may buffer; once ``flush`` returns,
    everything written is durable (the worker acknowledges only then). ``flush`` may
    raise (a full disk): the worker then flushes again later, or calls the sink's
    ``discard()`` if it has one before it reads the same entries again.

    Records are dicts shaped as the archive's lines, without ``seq`` and ``prev``. A
    sink that also has ``write_encoded(batch, last_ids)`` (as ``SegmentSink``)
    gets the batch there instead, with entries already encoded (see that method);
    any other sink receives dicts.
    """

    def last_ids(self) -> dict[str, str]:
        """The last entry id archived per stream (the worker skips ids at or below)."""
        ...

    def has_graph(self, digest: str) -> bool: ...

    def write(self, batch: list[dict[str, Any]]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


# -- encoding one entry --------------------------------------------------------------
class _Raw(Exception):
    """A value that stays raw (internal)."""


def _checked_int(text: str) -> int:
    number = int(text)
    if number not in _INT_RANGE:
        raise _Raw
    return number


def _value(raw: bytes) -> Any:
    """The value ``raw`` holds, or :class:`_Raw` when it must stay raw."""
    try:
        value = loads_value(raw, VALUE_LIMITS)
    except LimitExceeded:
        # json.dumps writes NaN and Infinity (rqse reads them): archived as null, as
        # the engine's encoder writes them. The standard parser recurses, and depth
        # is only known after parsing: RecursionError is caught too.
        if b"NaN" not in raw and b"Infinity" not in raw:
            raise _Raw from None
        try:
            value = json.loads(raw.decode())
        except (ValueError, RecursionError):
            raise _Raw from None
        return orjson.loads(orjson.dumps(value))  # NaN -> null
    if has_long_digits(raw):
        # orjson reads an integer past 64 bits as a float, losing digits; the standard
        # parser (depth known to be within the limit here) tells whether one is there.
        with contextlib.suppress(ValueError):  # _Raw is no ValueError: it goes through
            json.loads(raw, parse_int=_checked_int)
    return value


def _base64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def entry_record(stream: str, entry_id: str, fields: list[bytes] | None) -> dict[str, Any]:
    """The archive record of one stream entry (``fields``: names and values, flat, as
    XREAD returns them; None or empty once deleted). Never raises for what an entry
    holds: a value that does not decode is kept in ``raw``."""
    if not fields:  # say so rather than hide the gap
        return {"stream": stream, "id": entry_id, "gone": True}
    event: dict[str, Any] = {}
    raw: dict[str, str] = {}
    for name, value in zip(fields[0::2], fields[1::2], strict=True):
        try:
            text = name.decode()
        except UnicodeDecodeError:
            raw[name.decode("utf-8", "backslashreplace")] = _base64(value)
            continue
        try:
            decoded = _value(value)
            orjson.dumps([[[decoded]]])  # writable where a line holds it: record, event
        except (_Raw, orjson.JSONEncodeError, orjson.JSONDecodeError):
            event.pop(text, None)  # a repeated name: its last value counts
            raw[text] = _base64(value)
            continue
        raw.pop(text, None)
        event[text] = decoded
    record: dict[str, Any] = {"stream": stream, "id": entry_id, "event": event}
    if raw:
        record["raw"] = raw
    return record


def raw_record(stream: str, entry_id: str, fields: list[bytes]) -> dict[str, Any]:
    """The entry with every field raw: its record when :func:`entry_record` failed."""
    raw = {
        name.decode("utf-8", "backslashreplace"): _base64(value)
        for name, value in zip(fields[0::2], fields[1::2], strict=False)
    }
    return {"stream": stream, "id": entry_id, "event": {}, "raw": raw}


def raw_value(record: dict[str, Any], name: str) -> bytes | None:
    """The exact bytes of a field ``record`` keeps raw, or None."""
    text = (record.get("raw") or {}).get(name)
    return base64.b64decode(text) if isinstance(text, str) else None


# -- encoding entries as written (the receipts worker's fast path) -------------------
# Brackets a record may hold and be copied as is: brackets count at least a value's
# depth, and orjson writes 254 levels, of which a line takes two (record, event) above
# its values. Deeper values take the decoding path (entry_record).
MAX_BRACKETS = 250
_MAX_SHAPES = 1024  # field-name tuples remembered per stream (engine events have a handful)
_consume: Callable[[Iterator[Any]], None] = deque(maxlen=0).extend  # runs it, keeps nothing


# Literals that can separate values (all_plain): each has one spelling (no escape, no
# number form); a value holding one is checked with the next.
_SEPARATORS: dict[bytes, Any] = {b"null": None, b"false": False, b"true": True}


def joined_values(
    values_lists: list[list[bytes] | None], separator: bytes = b"null"
) -> tuple[bytes, int]:
    """The values of these lists (an entry's values each, None for a deleted entry)
    as one array with ``separator`` between each two, ``[v0,null,v1,null,v2]``, and
    how many they are (:func:`all_plain`)."""
    values = list(chain.from_iterable(filter(None, values_lists)))
    return b"[" + (b",%b," % separator).join(values) + b"]", len(values)


def all_plain(text: bytes, count: int, separator: bytes = b"null") -> bool:
    """True if each of the ``count`` values joined in ``text`` (:func:`joined_values`) is
    JSON on its own and holds no line break or carriage return, told by one parse of
    them all instead of one per value (the calls cost more than the parsing); False if
    it cannot be told so: each entry is then checked on its own.

    Suppose the text holds no ``null`` but the n - 1 of the separators (``null`` has no
    other spelling: no escape, no number form), it parses, and its odd elements are all
    None. Each None comes from a null outside any string, so every separator's null is
    one, at the top level, and so are the commas around it. Between two such commas (or
    a bracket and a comma) the array holds one element, made of one value's bytes
    alone, tokenised as they are on their own (no token runs past those commas): each
    value is one JSON value on its own. The same holds for ``false`` and ``true`` as
    separators, their odd elements then booleans (not 0 or 1, which equal them).

    Values each JSON on their own always join into such a text, unless they hold every
    separator (:func:`check_values` tries each) or one is nested to orjson's depth
    limit (the array adds a level).
    """
    return check_chunk(text, count, separator)[0]


def check_values(values_lists: list[list[bytes] | None]) -> tuple[bool, bool, bytes]:
    """:func:`check_chunk` of the values joined by the first separator they do not
    hold (``null``, else ``false``, else ``true``), and the text joined."""
    values = list(chain.from_iterable(filter(None, values_lists)))
    count = len(values)
    if not count:
        return True, True, b"[]"
    text = b"[]"
    for separator in _SEPARATORS:
        text = b"[" + (b",%b," % separator).join(values) + b"]"
        if text.count(separator) == count - 1:
            return (*_check_separated(text, count, separator), text)
    return False, False, text


def check_chunk(text: bytes, count: int, separator: bytes = b"null") -> tuple[bool, bool]:
    """:func:`all_plain`, and whether every value, copied as written, stays within the
    depth orjson writes two levels down (a record in a line): the brackets of the whole
    chunk bound it, else one write of the parsed chunk, wrapped once more, tells. One
    parse for both."""
    if not count:
        return True, True
    if text.count(separator) != count - 1:
        return False, False
    return _check_separated(text, count, separator)


def _check_separated(text: bytes, count: int, separator: bytes) -> tuple[bool, bool]:
    """:func:`check_chunk` once ``separator`` is known to occur only between values."""
    if 10 in text or 13 in text:
        return False, False
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False, False
    between = parsed[1::2]
    plain = len(parsed) == 2 * count - 1 and between.count(_SEPARATORS[separator]) == count - 1
    if plain and separator != b"null":  # False == 0 and True == 1: only booleans count
        plain = set(map(type, between)) <= {bool}
    if not plain or text.count(b"[") + text.count(b"{") <= MAX_BRACKETS:
        return plain, plain
    try:
        orjson.dumps([parsed])  # [chunk [value]]: the value two levels down, as in a line
    except orjson.JSONEncodeError:
        return plain, False
    return plain, True


def fits_a_line(record: bytes) -> bool:
    """A record copied from its values' bytes still makes one line the archive reads back:
    no line break or carriage return in it (JSON whitespace, yet they would end the
    line), and not too deep for the reader (its brackets bound its depth)."""
    return (
        10 not in record
        and 13 not in record
        and record.count(b"[") + record.count(b"{") <= MAX_BRACKETS
    )


def each_json(values: list[bytes]) -> bool:
    """Every value JSON on its own, parsed one by one (as decoding parses them)."""
    try:
        _consume(map(orjson.loads, values))
    except orjson.JSONDecodeError:
        return False
    return True


def _literal(text: bytes) -> bytes:
    """``text`` as a constant part of a bytes format."""
    return text.replace(b"%", b"%%")


@dataclass(frozen=True, slots=True)
class EntryShape:
    """How the entries of one stream with one tuple of field names are encoded without
    being decoded: ``record % (entry id, *values)`` is the entry's record as orjson
    spells it, without its opening brace (what ``SegmentSink.write_encoded`` takes).
    Only the values' bytes may differ from a re-encoding: the writer's own number
    spelling and escapes are kept."""

    record: bytes
    start_at: tuple[int, int] | None  # where kind and graph are, when both are fields

    @classmethod
    def of(cls, stream: str, names: tuple[bytes, ...]) -> EntryShape | None:
        """None if a name is not UTF-8 or is repeated: those entries are decoded."""
        try:
            texts = [name.decode() for name in names]
        except UnicodeDecodeError:
            return None
        if len(set(texts)) != len(texts):
            return None
        # An entry id is digits and a dash (Redis makes them): nothing in it to escape.
        head = b'"stream":' + _literal(orjson.dumps(stream)) + b',"id":"%b","event":{'
        members = b",".join(_literal(orjson.dumps(text)) + b":%b" for text in texts)
        start_at = None
        if "kind" in texts and "graph" in texts:
            start_at = texts.index("kind"), texts.index("graph")
        return cls(head + members + b"}}", start_at)


class EntryShapes:
    """The shapes of one stream's entries, by field names (at most ``_MAX_SHAPES``)."""

    __slots__ = ("_known", "stream")

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self._known: dict[tuple[bytes, ...], EntryShape | None] = {}

    def of(self, names: list[bytes]) -> EntryShape | None:
        key = tuple(names)
        if key not in self._known:
            if len(self._known) >= _MAX_SHAPES:
                self._known.clear()
            self._known[key] = EntryShape.of(self.stream, key)
        return self._known[key]


# -- reading -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ArchivedEvent:
    """One record of the archive (an entry, a graph or a checkpoint) and where it is.

    ``line`` holds the record's bytes (their sha256 is the next record's ``prev``)."""

    file: str
    number: int  # line number in its file, from 1
    line: bytes
    record: dict[str, Any]

    @property
    def seq(self) -> int:
        return int(self.record["seq"])

    @property
    def stream(self) -> str | None:
        stream = self.record.get("stream")
        return stream if isinstance(stream, str) else None

    @property
    def id(self) -> str | None:
        entry_id = self.record.get("id")
        return entry_id if isinstance(entry_id, str) else None

    @property
    def event(self) -> dict[str, Any] | None:
        """The decoded fields of an entry; None for a gone entry, a graph, a checkpoint."""
        event = self.record.get("event")
        return event if isinstance(event, dict) else None


@dataclass(frozen=True, slots=True)
class ArchiveProblem:
    """A line of the archive that holds no record; replay reports it."""

    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


def decode_line(line: bytes) -> dict[str, Any] | str:
    """The record a line holds, or why it holds none (never raises)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        return f"not JSON ({error})"
    if not isinstance(record, dict):
        return "not a JSON object"
    if type(record.get("seq")) is not int:
        return "not a record (no seq)"
    if "prev" in record and not isinstance(record["prev"], str):
        return "not a record (a prev that is not text)"
    return record


def segment_paths(directory: Path) -> list[Path]:
    """The segments of an archive, in order (``.tmp`` and other files left out)."""
    found = []
    for path in directory.iterdir():
        name = path.name
        number = name[len(_PREFIX) :].split(".", 1)[0]
        if name.startswith(_PREFIX) and name.endswith((_PLAIN, _PACKED)) and number.isdigit():
            found.append((int(number), path))
    return [path for _, path in sorted(found)]


def iter_archive(
    directory: str | Path, *, max_line: int = MAX_LINE_BYTES
) -> Iterator[ArchivedEvent | ArchiveProblem]:
    """Every record of the archive in archive order (each stream's entries in id order),
    across plain and gzip segments, one line at a time: memory holds a line (at most
    ``max_line`` bytes), never the archive. A line that holds no record is yielded as
    an :class:`ArchiveProblem` and reading goes on; an incomplete final line (a write
    torn by a crash) is one too. Raises ArchiveError only when the directory or a
    segment cannot be read at all."""
    root = Path(directory)
    if not root.is_dir():
        raise ArchiveError(f"{root}: no such archive directory")
    try:
        for path in segment_paths(root):
            opener = gzip.open if path.name.endswith(_PACKED) else open
            with opener(path, "rb") as file:
                yield from _records(file, path.name, max_line)
    except (OSError, EOFError) as error:  # unreadable, or a gzip stream cut short
        raise ArchiveError(f"{root}: cannot read the archive: {error}") from None


class _Lines(Protocol):
    def readline(self, size: int = -1, /) -> bytes: ...


def _records(file: _Lines, name: str, max_line: int) -> Iterator[ArchivedEvent | ArchiveProblem]:
    number = 0
    while raw := file.readline(max_line + 1):
        number += 1
        if len(raw) > max_line and not raw.endswith(b"\n"):
            while (rest := file.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass  # the rest of the line, a chunk at a time
            yield ArchiveProblem(name, number, f"line longer than {max_line:,} bytes")
            continue
        if not raw.endswith(b"\n"):
            yield ArchiveProblem(name, number, "incomplete final line (torn write)")
            continue
        line = raw[:-1]
        if not line:
            continue
        decoded = decode_line(line)
        if isinstance(decoded, str):
            yield ArchiveProblem(name, number, decoded)
        else:
            yield ArchivedEvent(name, number, line, decoded)


def read_archive(directory: str | Path) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """Every ``(line, record)`` of the archive in order, across plain and gzip segments.

    Raises ArchiveError for a missing directory or a line that holds no record
    (naming the segment and line number); :func:`iter_archive` goes on instead.
    Chain checks are replay's job.
    """
    for item in iter_archive(directory):
        if isinstance(item, ArchiveProblem):
            raise ArchiveError(str(item))
        yield item.line, item.record
