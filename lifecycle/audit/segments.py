"""The archive's files: JSON Lines segments, written durably, recovered on opening.

:class:`SegmentSink` is the receipts worker's default :class:`lifecycle.archive.Sink`.
Its rules, each for a reason:

* **Nothing counts before fsync.** ``write`` only stages lines in memory;
  ``flush`` appends them with plain ``os.write`` (no userspace buffer whose state an
  error would leave unknown), fsyncs, and only then moves the chain head and the
  last ids. A write or fsync that fails (disk full, read-only, permissions, I/O)
  raises :class:`DiskRefused` and keeps the staged lines: the next ``flush`` cuts
  the file back to its last durable size (dropping the failed attempt's bytes, which
  nobody acknowledged) and writes them again. A failed fsync is never trusted to
  have kept anything (the kernel may drop the dirty pages it could not write).
* **Evidence is never cut.** Opening drops only an incomplete final line (bytes
  after the last newline: a write torn by a crash). A complete line that does not
  parse, anywhere, is kept and reported once, ``FILE:LINE``; the chain runs on
  through it (it takes one ``seq``, the next seal's ``prev`` covers its bytes), so
  replay's chain check points at it.
* **One seal per batch.** Each ``write`` ends with a seal record: the sha256 of
  the lines since the last chained record and an Adler-32 per line
  (:mod:`lifecycle.audit.archive`), written and fsync'd with the batch.
* **Private files.** Segments and the lock are created 0600 and directories 0700,
  whatever the umask.
* **A new segment appears whole.** It is written as ``.tmp`` (checkpoint line,
  fsync), then renamed; opening deletes stray ``.tmp`` files. A rotation the disk
  refuses is retried at a later flush while the current segment grows.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import logging
import os
import zlib
from collections.abc import Mapping, Sequence
from itertools import count
from pathlib import Path
from typing import Any

import orjson

from lifecycle.audit.archive import (
    ENCODED_LINE,
    SEAL_LINE,
    ArchiveError,
    Chain,
    decode_line,
    segment_paths,
)

__all__ = ["DIR_MODE", "FILE_MODE", "DiskRefused", "SegmentSink"]

log = logging.getLogger(__name__)

FILE_MODE = 0o600  # segments hold every event's data: owner only
DIR_MODE = 0o700
_PREFIX, _PLAIN, _PACKED, _TEMPORARY = "segment-", ".jsonl", ".jsonl.gz", ".tmp"
_REPORTED_PROBLEMS = 20  # corrupt lines logged one by one at opening; the rest counted

# How an errno reads in "archive <state> at PATH": one state per kind of refusal.
_STATES = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk full (quota)",
    errno.EROFS: "read-only",
    errno.EACCES: "not writable (permission denied)",
    errno.EPERM: "not writable (operation not permitted)",
    errno.EIO: "I/O error",
    errno.ENOENT: "segment missing",
}


class DiskRefused(ArchiveError):
    """Raised by :meth:`SegmentSink.flush` when the disk refuses a write or fsync.

    Nothing of the staged lines counts as archived; they stay staged and the next
    ``flush`` tries again. ``state`` names the refusal (``"disk full"``,
    ``"read-only"``, ...) so a caller can say once when it changes.
    """

    def __init__(self, path: Path, error: OSError) -> None:
        self.path = path
        self.errno = error.errno
        self.state = _STATES.get(error.errno or 0, error.strerror or "write refused")
        super().__init__(f"archive {self.state} at {path}")


def _create(path: Path, flags: int) -> int:
    """Open ``path`` created with FILE_MODE (fchmod: the umask may have removed bits)."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def _make_dirs(directory: Path) -> None:
    """Create ``directory`` and missing parents with DIR_MODE; existing ones are left."""
    missing = []
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    for path in reversed(missing):
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(path, DIR_MODE)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # a short write (the disk filling up) is followed by the error
        view = view[os.write(fd, view) :]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentSink:
    """JSON Lines segments under ``directory``: ``segment-<first seq>.jsonl[.gz]``.

    Opening recovers (drops an incomplete final line, reports corrupt lines, fsyncs
    what a killed process may have left in the page cache) and reads the last
    segment for the chain head and the last id per stream. An exclusive lock on
    ``directory/.lock`` keeps a second worker out. Raises :class:`ArchiveError`
    (one line, with the path) when the archive cannot be opened.
    """

    def __init__(
        self, directory: str | Path, *, segment_bytes: int = 64 << 20, compress: bool = False
    ) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.compress = compress
        self.bytes_written = 0
        self.problems: list[str] = []  # corrupt lines found at opening, "FILE:LINE: why"
        try:
            _make_dirs(self.directory)
            # Read-only is enough for flock, and leaves the file system remountable.
            lock = self.directory / ".lock"
            if not lock.exists():
                os.close(_create(lock, os.O_WRONLY))
            self._lock = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            raise ArchiveError(f"{self.directory}: {error.strerror}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise ArchiveError(f"{self.directory}: another receipts worker holds it") from None
        # The durable state: chain head (next seq, the hash since the last chained
        # record), last id per stream, graphs; moved only once a flush's fsync returned.
        self._seq, self._chain = 0, Chain()
        self._last: dict[str, str] = {}
        self._graphs: set[str] = set()
        # What write() staged since: lines and what they will add to the state above.
        self._staged: list[bytes] = []
        self._staged_head = (self._seq, self._chain)
        self._staged_last: dict[str, str] = {}
        self._staged_graphs: set[str] = set()
        self._path: Path | None = None
        self._fd: int | None = None
        self._durable = 0  # bytes of the open segment known to be on disk
        self._torn = False  # a failed flush may have left bytes past _durable
        self._dir_unsynced = False
        self._rotation_refused: str | None = None
        try:
            self._recover()
        except OSError as error:
            self._close_files()
            raise ArchiveError(f"{self.directory}: cannot open the archive: {error}") from None

    # -- Sink ----------------------------------------------------------------------
    def last_ids(self) -> dict[str, str]:
        return dict(self._last)

    def has_graph(self, digest: str) -> bool:
        return digest in self._graphs or digest in self._staged_graphs

    def write(self, batch: list[dict[str, Any]]) -> None:
        self.write_encoded(batch, {})

    def write_encoded(
        self, batch: Sequence[dict[str, Any] | bytes], last_ids: Mapping[str, str]
    ) -> None:
        """``write``, where an entry's record may come encoded: ``bytes``, its JSON as
        orjson spells it, without the opening brace (``"stream":…,"id":…,"event":{…}}``).
        Its line is then the record's line, byte for byte, at the cost of one format;
        ``last_ids`` (the last entry per stream in the batch) stands in for the stream
        and id the sink would otherwise read from the records. Staged until ``flush``,
        followed by a seal: the chain's hash over the batch (one sha256 for all its
        lines) and an Adler-32 per line (docs/audit.md)."""
        if not batch:
            return
        seq, chain = self._staged_head
        records: list[dict[str, Any]] = []
        try:
            # Most batches hold encoded entries only: their lines made in one call of
            # C, no Python loop per line. A dict in the batch fails the %b at once.
            lines = list(map(ENCODED_LINE.__mod__, zip(count(seq), batch)))
            seq += len(lines)
        except TypeError:
            lines = []
            for record in batch:
                if type(record) is bytes:
                    line = ENCODED_LINE % (seq, record)
                else:
                    assert isinstance(record, dict)
                    line = orjson.dumps({"seq": seq, **record})
                    records.append(record)
                lines.append(line)
                seq += 1
        data = b"\n".join(lines)
        chain = chain.copy()
        chain.add_lines(data)
        checksums = orjson.dumps(list(map(zlib.adler32, lines)))
        seal = SEAL_LINE % (seq, chain.head.encode(), checksums)
        chain.add(seal, chained=True)
        # Staged once every line is made: a record orjson cannot write stages nothing.
        self._staged.append(b"%b\n%b\n" % (data, seal))
        self._staged_head = seq + 1, chain
        for record in records:
            if "stream" in record:
                self._staged_last[record["stream"]] = record["id"]
            elif "graph" in record:
                self._staged_graphs.add(record["graph"])
        self._staged_last.update(last_ids)

    def flush(self) -> None:
        """Make everything written durable; :class:`DiskRefused` if the disk refuses
        (the lines stay staged: call again to retry). Rotates a full segment after."""
        if self._staged or self._torn:
            self._write_staged()
        if self._dir_unsynced:
            try:
                _fsync_dir(self.directory)
                self._dir_unsynced = False
            except OSError as error:
                raise DiskRefused(self.directory, error) from None
        if self._durable >= self.segment_bytes:
            self._rotate()

    def discard(self) -> int:
        """Forget what was written since the last flush (the caller will read those
        entries again); returns how many bytes were dropped."""
        dropped = sum(map(len, self._staged))
        self._staged = []
        self._staged_head = self._seq, self._chain
        self._staged_last = {}
        self._staged_graphs = set()
        return dropped

    def close(self) -> None:
        """Flush once more and close; what the disk still refuses is dropped (logged),
        never raised: nothing of it was acknowledged."""
        if self._path is not None and (self._staged or self._torn):
            try:
                self._write_staged()
            except DiskRefused as error:
                dropped = self.discard()
                log.warning(
                    "%s; %d bytes not archived, read again at the next start", error, dropped
                )
        self._close_files()

    # -- writing -------------------------------------------------------------------
    def _write_staged(self) -> None:
        assert self._path is not None
        data = b"".join(self._staged)
        try:
            if self._fd is None:  # closed after a refusal: the file system may have changed
                self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            if self._torn:
                os.ftruncate(self._fd, self._durable)
            self._torn = True
            _write_all(self._fd, data)
            os.fsync(self._fd)
        except OSError as error:
            if self._fd is not None:
                # Cut the failed attempt now (a full disk allows it; a read-only one
                # does not, and the next try does it), so the file shows what is durable.
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._durable)
                    self._torn = False
            # Closed so that a read-only remount can proceed; reopened by the next try.
            self._close_segment()
            raise DiskRefused(self._path, error) from None
        self._torn = False
        self._durable += len(data)
        self.bytes_written += len(data)
        self._seq, self._chain = self._staged_head
        self._last.update(self._staged_last)
        self._graphs |= self._staged_graphs
        self._staged = []
        self._staged_last = {}
        self._staged_graphs = set()

    def _close_segment(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):  # a refused flush already raised
                os.close(self._fd)
            self._fd = None

    def _close_files(self) -> None:
        self._close_segment()
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1

    def _checkpoint_line(self) -> bytes:
        checkpoint = {"streams": self._last, "graphs": sorted(self._graphs)}
        record = {"seq": self._seq, "prev": self._chain.head, "checkpoint": checkpoint}
        return orjson.dumps(record) + b"\n"

    def _new_segment(self) -> None:
        """Start a new segment holding its checkpoint, fsync'd and renamed into place,
        and make it the open one. OSError leaves no new segment behind (unless even the
        unlink is refused: a ``.tmp`` the next opening deletes)."""
        path = self.directory / f"{_PREFIX}{self._seq:012d}{_PLAIN}"
        temporary = path.with_name(path.name + _TEMPORARY)
        line = self._checkpoint_line()
        fd = _create(temporary, os.O_WRONLY | os.O_TRUNC | os.O_APPEND)
        try:
            _write_all(fd, line)
            os.fsync(fd)
            os.rename(temporary, path)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        try:
            _fsync_dir(self.directory)
        except OSError:
            self._dir_unsynced = True  # the rename happened; made durable at a later flush
        self._close_segment()
        self._path, self._fd, self._durable = path, fd, len(line)
        chain = self._chain.copy()
        chain.add(line[:-1], chained=True)
        self._seq, self._chain = self._seq + 1, chain
        self._staged_head = self._seq, self._chain

    def _rotate(self) -> None:
        closed = self._path
        try:
            self._new_segment()
        except OSError as error:
            state = DiskRefused(self.directory, error).state
            if state != self._rotation_refused:  # once per state, not at every flush
                log.warning(
                    "archive %s at %s: cannot start a new segment; %s grows until it can",
                    state,
                    self.directory,
                    closed,
                )
                self._rotation_refused = state
            return
        self._rotation_refused = None
        if self.compress and closed is not None:
            _gzip(closed)

    # -- opening -------------------------------------------------------------------
    def _recover(self) -> None:
        for stale in self.directory.glob("*" + _TEMPORARY):
            stale.unlink()
        for path in segment_paths(self.directory):  # a crash after compressing, before unlink
            plain = path.with_suffix("")
            if path.name.endswith(_PACKED) and plain.exists():
                # The copy goes, whichever it is: the original only once the copy is
                # known to hold the same bytes.
                if _same_content(plain, path):
                    plain.unlink()
                else:
                    log.warning("%s: not a copy of %s; removed, the original kept", path, plain)
                    path.unlink()
        segments = segment_paths(self.directory)
        while segments:
            last = segments[-1]
            if last.name.endswith(_PACKED):
                raise ArchiveError(f"{last}: last segment is compressed; cannot append")
            if self._drop_incomplete_line(last) > 0:
                break
            # Nothing but a torn checkpoint: a segment torn while being created (before
            # segments were renamed into place). Its predecessor is complete.
            last.unlink()
            segments.pop()
        if not segments:
            self._new_segment()
            return
        self._read_state(segments)
        self._path = segments[-1]
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        os.fsync(self._fd)  # what a killed process wrote may be in the page cache only
        self._durable = self._path.stat().st_size
        self._staged_head = self._seq, self._chain

    def _drop_incomplete_line(self, path: Path) -> int:
        """Cut the bytes after the last newline of ``path`` (a torn write: never
        fsync'd, so never acknowledged); returns the size left."""
        with open(path, "r+b") as file:
            size = file.seek(0, os.SEEK_END)
            end = size
            while end > 0:  # back to the last newline, a block at a time
                start = max(0, end - (1 << 16))
                file.seek(start)
                cut = file.read(end - start).rfind(b"\n")
                if cut != -1:
                    end = start + cut + 1
                    break
                end = start
            if end < size:
                file.seek(0)
                lines = file.read(end).count(b"\n")
                log.warning(
                    "%s:%d: dropping an incomplete final line (%d bytes, no newline: torn write)",
                    path,
                    lines + 1,
                    size - end,
                )
                file.truncate(end)
                os.fsync(file.fileno())
        return end

    def _read_state(self, segments: list[Path]) -> None:
        """The chain head, last ids and graphs, from the last segment whose checkpoint
        reads (normally the last one) and the records after it."""
        first = len(segments) - 1
        while first > 0 and not _opens_with_checkpoint(segments[first]):
            first -= 1
        problems = 0
        for path in segments[first:]:
            opener = gzip.open if path.name.endswith(_PACKED) else open
            with opener(path, "rb") as file:
                for number, raw in enumerate(file, 1):
                    line = raw.rstrip(b"\n")
                    decoded = decode_line(line)
                    if isinstance(decoded, str):
                        problems += 1
                        if problems <= _REPORTED_PROBLEMS:
                            log.warning("%s:%d: %s; kept as evidence", path, number, decoded)
                        self.problems.append(f"{path.name}:{number}: {decoded}")
                        self._seq += 1  # it took a seq; the chain runs on through it
                        self._chain.add(line, chained=False)
                    else:
                        record = decoded
                        if "checkpoint" in record:
                            self._last = dict(record["checkpoint"].get("streams", {}))
                            self._graphs = set(record["checkpoint"].get("graphs", []))
                        elif isinstance(record.get("stream"), str):
                            self._last[record["stream"]] = str(record["id"])
                        elif isinstance(record.get("graph"), str):
                            self._graphs.add(record["graph"])
                        self._seq = int(record["seq"]) + 1
                        self._chain.add(line, chained="prev" in record)
        if problems > _REPORTED_PROBLEMS:
            log.warning(
                "%s: %d more corrupt lines kept as evidence (replay lists them)",
                self.directory,
                problems - _REPORTED_PROBLEMS,
            )


def _opens_with_checkpoint(path: Path) -> bool:
    opener = gzip.open if path.name.endswith(_PACKED) else open
    with opener(path, "rb") as file:
        decoded = decode_line(file.readline().rstrip(b"\n"))
    return isinstance(decoded, dict) and isinstance(decoded.get("checkpoint"), dict)


def _same_content(plain: Path, packed: Path) -> bool:
    """Whether ``packed`` decompresses to exactly ``plain``'s bytes (read in chunks)."""
    try:
        with open(plain, "rb") as left, gzip.open(packed, "rb") as right:
            while True:
                chunk = left.read(1 << 20)
                if chunk != right.read(len(chunk) or 1):
                    return False
                if not chunk:
                    return True
    except (OSError, EOFError):  # unreadable, or cut short
        return False


def _gzip(path: Path) -> None:
    """Compress a closed segment: ``.gz.tmp``, fsync, rename, unlink the original. The
    disk refusing it leaves the segment plain (readable all the same)."""
    packed = path.with_name(path.name + ".gz")
    temporary = packed.with_name(packed.name + _TEMPORARY)
    try:
        with (
            open(path, "rb") as source,
            open(_create(temporary, os.O_WRONLY | os.O_TRUNC), "wb") as raw,
        ):
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as target:
                while chunk := source.read(1 << 20):
                    target.write(chunk)
            raw.flush()
            os.fsync(raw.fileno())
        temporary.rename(packed)
        path.unlink()
        _fsync_dir(path.parent)
    except OSError as error:
        log.warning("%s: not compressed (%s); left as it is", path, error.strerror)
        with contextlib.suppress(OSError):
            temporary.unlink()
