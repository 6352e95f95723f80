"""The receipts archive: JSON Lines segments chained by sha256 (format in docs/audit.md).

One record per line. Every record carries ``seq`` (0, 1, 2, ... over the whole
archive) and ``prev``, the sha256 of the previous record's line, so altering,
dropping or reordering a record breaks the chain where it happened. Kinds of
record:

``{"seq", "prev", "checkpoint": {"streams": {stream: last id}, "graphs": [hash]}}``
    first line of every segment: where the archive stood, so a restart reads
    one segment, not the whole archive;
``{"seq", "prev", "stream", "id", "event"}``
    one stream entry, its fields decoded (``"gone": true`` and no event when the
    entry was deleted before it could be read);
``{"seq", "prev", "graph", "text"}``
    a compiled graph's canonical JSON, archived before its first start-workflow.

:class:`SegmentSink` writes them: segment files rotated by size, optionally
gzip-compressed once closed, fsync'd by :meth:`SegmentSink.flush`. Any class
with the :class:`Sink` methods can replace it.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from lifecycle.errors import LifecycleError

__all__ = ["GENESIS", "ArchiveError", "SegmentSink", "Sink", "id_order", "read_archive"]

log = logging.getLogger(__name__)

GENESIS = "0" * 64  # ``prev`` of record 0
_PREFIX, _PLAIN, _PACKED = "segment-", ".jsonl", ".jsonl.gz"
# An encoded record's line: what orjson.dumps({"seq": seq, "prev": prev, **record}) spells.
_ENCODED_LINE = b'{"seq":%d,"prev":"%b",%b'


class ArchiveError(LifecycleError):
    """Raised when an archive cannot be opened, read or written (one line, with the path)."""


def id_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable pair: ``"1700000000000-5"`` -> ``(1700000000000, 5)``."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def line_hash(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


class Sink(Protocol):
    """Where the receipts worker writes. ``write`` may buffer; once ``flush`` returns,
    everything written is durable (the worker acknowledges only then).

    Records are dicts shaped as the archive's lines, without ``seq`` and ``prev``. A
    sink that also has ``write_encoded(batch, last_ids)`` (as :class:`SegmentSink`)
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


class SegmentSink:
    """JSON Lines segments under ``directory``: ``segment-<first seq>.jsonl[.gz]``.

    Opening recovers: it drops a torn last line left by a crash, fsyncs what
    the previous process may have left in the page cache, and reads the last
    segment to learn the chain head and the last id per stream. An exclusive
    lock on ``directory/.lock`` keeps a second worker out.
    """

    def __init__(
        self, directory: str | Path, *, segment_bytes: int = 64 << 20, compress: bool = False
    ) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.compress = compress
        self.bytes_written = 0
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.directory / ".lock", "w")  # noqa: SIM115 - held while open
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ArchiveError(f"{self.directory}: another receipts worker holds it") from None
        except OSError as error:
            raise ArchiveError(f"{self.directory}: {error.strerror}") from None
        self._seq, self._prev = 0, GENESIS.encode()  # the chain head: next seq, hex sha256
        self._last: dict[str, str] = {}
        self._graphs: set[str] = set()
        self._file: IO[bytes] | None = None
        self._path: Path | None = None
        self._size = 0
        self._recover()

    # -- Sink ----------------------------------------------------------------------
    def last_ids(self) -> dict[str, str]:
        return dict(self._last)

    def has_graph(self, digest: str) -> bool:
        return digest in self._graphs

    def write(self, batch: list[dict[str, Any]]) -> None:
        self.write_encoded(batch, {})

    def write_encoded(
        self, batch: Sequence[dict[str, Any] | bytes], last_ids: Mapping[str, str]
    ) -> None:
        """``write``, where an entry's record may come encoded: ``bytes``, its JSON as
        orjson spells it, without the opening brace (``"stream":…,"id":…,"event":{…}}``).
        Its line is then the record's line, byte for byte, at the cost of one format;
        ``last_ids`` (the last entry per stream in the batch) stands in for the stream
        and id the sink would otherwise read from the records."""
        assert self._file is not None
        seq, prev = self._seq, self._prev
        sha256 = hashlib.sha256
        lines, records = [], []
        for record in batch:
            if type(record) is bytes:
                line = _ENCODED_LINE % (seq, prev, record)
            else:
                line = orjson.dumps({"seq": seq, "prev": prev.decode(), **record})
                records.append(record)
            lines.append(line)
            seq += 1
            prev = sha256(line).hexdigest().encode()
        lines.append(b"")  # the last line's end, without copying the batch once more
        data = b"\n".join(lines)
        self._file.write(data)
        # The sink's state moves once the batch is in the file: after an error above it
        # still describes the file (a record orjson cannot write, say).
        self._seq, self._prev = seq, prev
        for record in records:
            self._note(record)
        self._last.update(last_ids)
        self._size += len(data)
        self.bytes_written += len(data)

    def flush(self) -> None:
        self._sync()
        if self._size >= self.segment_bytes:
            self._rotate()

    def close(self) -> None:
        if self._file is not None:
            self._sync()  # a full segment rotates at the next flush, not into an empty one now
            self._file.close()
            self._file = None
        self._lock.close()

    # -- internals -----------------------------------------------------------------
    def _note(self, record: dict[str, Any]) -> None:
        """What a record adds to the next checkpoint: its stream's last id, or its graph."""
        if "stream" in record:
            self._last[record["stream"]] = record["id"]
        elif "graph" in record:
            self._graphs.add(record["graph"])

    def _sync(self) -> None:
        assert self._file is not None
        self._file.flush()
        os.fsync(self._file.fileno())

    def _open_segment(self) -> None:
        self._path = self.directory / f"{_PREFIX}{self._seq:012d}{_PLAIN}"
        self._file = open(self._path, "ab")  # noqa: SIM115 - the open segment
        self._size = 0
        checkpoint = {"streams": self._last, "graphs": sorted(self._graphs)}
        self.write([{"checkpoint": checkpoint}])
        self._sync()  # not flush(): a checkpoint past segment_bytes would rotate forever
        _fsync_dir(self.directory)

    def _rotate(self) -> None:
        assert self._file is not None and self._path is not None
        closed = self._path
        self._file.close()
        # The new segment exists (with its checkpoint) before the old one is compressed,
        # so a crash in between leaves a readable archive either way.
        self._open_segment()
        if self.compress:
            _gzip(closed)

    def _recover(self) -> None:
        for stale in self.directory.glob("*.tmp"):
            stale.unlink()
        segments = _segments(self.directory)
        for path in segments:  # a crash after compressing, before removing the original
            if path.name.endswith(_PACKED) and path.with_suffix("").exists():
                path.with_suffix("").unlink()
        segments = _segments(self.directory)
        while segments:
            last = segments[-1]
            if last.name.endswith(_PACKED):
                raise ArchiveError(f"{last}: last segment is compressed; cannot append")
            good = _intact_prefix(last)
            if good:
                break
            last.unlink()  # torn while being created: its predecessor is complete
            segments.pop()
        if not segments:
            self._open_segment()
            return
        self._path = segments[-1]
        with open(self._path, "r+b") as file:
            file.truncate(len(good))
            os.fsync(file.fileno())
        for line in good.splitlines():
            record = orjson.loads(line)
            if "checkpoint" in record:
                self._last = dict(record["checkpoint"]["streams"])
                self._graphs = set(record["checkpoint"]["graphs"])
            else:
                self._note(record)
            self._seq, self._prev = record["seq"] + 1, line_hash(line).encode()
        self._file = open(self._path, "ab")  # noqa: SIM115 - the open segment
        self._size = len(good)


def _intact_prefix(path: Path) -> bytes:
    """The complete, parseable lines at the start of ``path`` (a crash may tear the last)."""
    data = path.read_bytes()
    end = lines = 0
    while (cut := data.find(b"\n", end)) != -1:
        try:
            orjson.loads(data[end:cut])
        except orjson.JSONDecodeError:
            break
        end, lines = cut + 1, lines + 1
    if end < len(data):
        # The worker writes only lines it reads back, so this is a crash's torn write:
        # nothing fsync'd, nothing acknowledged, read again from Redis. Said all the same.
        log.warning(
            "%s: dropping %d bytes after line %d (not a complete JSON line: torn write)",
            path,
            len(data) - end,
            lines,
        )
    return data[:end]


def _segments(directory: Path) -> list[Path]:
    found = [p for p in directory.iterdir() if p.name.startswith(_PREFIX)]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX) :].split(".", 1)[0]))


def _gzip(path: Path) -> None:
    packed = path.with_name(path.name + ".gz")
    temporary = packed.with_name(packed.name + ".tmp")
    with open(path, "rb") as source, open(temporary, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as target:
            while chunk := source.read(1 << 20):
                target.write(chunk)
        raw.flush()
        os.fsync(raw.fileno())
    temporary.rename(packed)
    path.unlink()
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_archive(directory: str | Path) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """Every ``(line, record)`` of the archive in order, across plain and gzip segments.

    Raises ArchiveError for a missing directory or a line that is not JSON
    (naming the segment and line number); chain checks are replay's job.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ArchiveError(f"{root}: no such archive directory")
    for path in _segments(root):
        opener = gzip.open if path.name.endswith(_PACKED) else open
        with opener(path, "rb") as file:
            for number, raw in enumerate(file, 1):
                line = raw.rstrip(b"\n")
                if not line:
                    continue
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError as error:
                    raise ArchiveError(f"{path.name}:{number}: not JSON ({error})") from None
                if not isinstance(record, dict):
                    raise ArchiveError(f"{path.name}:{number}: not a JSON object")
                yield line, record
