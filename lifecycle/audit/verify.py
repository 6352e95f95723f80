"""Tamper evidence: check an archive's hash chain and each stream's id order.

Each record names its own ``seq``, and each chained one (a seal after every
batch, a checkpoint) the sha256 of the lines since the chained record before it
(``lifecycle.audit.archive``); a changed line no longer matches the ``prev`` of
the seal after it, whose Adler-32 per line says which line it was; a dropped one
leaves a hole in ``seq``, a moved one stands where another ``seq`` belongs.
Within one stream entry ids must strictly increase (the worker archives each
stream in id order), so a duplicated or reordered entry is caught even where
someone recomputed the chain. What no chain catches — an archive rewritten
from the altered record to its end — replay's semantic check still can (the
transitions no longer match the archived start-tasks), and comparing the head
hash with one kept elsewhere always does.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from lifecycle.audit.archive import Chain, id_order

__all__ = ["ChainChecker", "Finding", "check_chain", "describe"]


@dataclass(frozen=True)
class Finding:
    """One problem found in an archive or by replay, with the event it concerns."""

    message: str
    workflow: str | None = None
    event: str | None = None  # entry id
    stream: str | None = None

    def __str__(self) -> str:
        return self.message


def describe(record: dict[str, Any]) -> str:
    """``record 12 ({flow}:lifecycle 1700-0, end-task of workflow w3)``: where it is."""
    seq = record.get("seq")
    if "graph" in record:
        return f"record {seq} (graph {record['graph']})"
    if "checkpoint" in record:
        return f"record {seq} (checkpoint)"
    if "adler32" in record:
        return f"record {seq} (seal)"
    event = record.get("event") or {}
    what = f"{event.get('kind', 'deleted entry')}"
    if isinstance(event.get("workflow"), str):
        what += f" of workflow {event['workflow']}"
    return f"record {seq} ({record.get('stream')} {record.get('id')}, {what})"


def _finding(record: dict[str, Any], message: str) -> Finding:
    event = record.get("event") or {}
    workflow = event.get("workflow") if isinstance(event.get("workflow"), str) else None
    return Finding(message, workflow, record.get("id"), record.get("stream"))


class ChainChecker:
    """The chain check fed one line at a time: memory bounded by the problems found,
    not by the archive (a gap is resolved as "missing" or "out of order" at the end)."""

    # Unchained records remembered for locating a change (seq, Adler-32, record): a
    # batch's worth in an archive the worker wrote; past this, a change is only dated.
    MAX_BLOCK = 100_000

    def __init__(self) -> None:
        self.expected = 0
        self._chain = Chain()
        self._previous: dict[str, Any] | None = None  # the last chained record
        self._block: list[tuple[int, int, dict[str, Any]]] = []  # unchained since it
        # A record missing or moved since the last chained record: the next one's prev
        # cannot match, and the gap is the finding already.
        self._gapped = False
        self._last_id: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}
        self._gaps: dict[int, tuple[int, dict[str, Any]]] = {}  # seq -> (order, record)
        self._moved: set[int] = set()  # gaps whose record turned up later
        self._findings: list[tuple[int, Finding]] = []

    def feed(self, line: bytes, record: dict[str, Any]) -> None:
        order = len(self._findings)
        seq = record.get("seq")
        if isinstance(seq, int) and seq in self._gaps:
            self._moved.add(seq)
        chained = "prev" in record
        if seq != self.expected:
            self._gaps[self.expected] = (order, record)
            self._findings.append((self.expected, Finding("")))  # resolved in finish()
            self._gapped = True
        elif chained and not self._gapped and record.get("prev") != self._chain.head:
            self._altered(record)
        stream, entry_id = record.get("stream"), record.get("id")
        if isinstance(stream, str) and isinstance(entry_id, str):
            position = id_order(entry_id)
            before = self._last_id.get(stream)
            if before is not None and position <= before[0]:
                message = (
                    f"{describe(record)} follows entry {before[1].get('id')} of its stream: "
                    "entries are duplicated or out of order"
                )
                self._findings.append((-1, _finding(record, message)))
            self._last_id[stream] = (position, record)
        self.expected = seq + 1 if isinstance(seq, int) else self.expected + 1
        self._chain.add(line, chained)
        if chained:
            self._previous, self._block, self._gapped = record, [], False
        elif len(self._block) < self.MAX_BLOCK and isinstance(seq, int):
            self._block.append((seq, zlib.adler32(line), record))

    @property
    def head(self) -> str:
        """The hash the next chained record must carry: compared with one kept
        elsewhere, it shows the whole archive unchanged up to its last line."""
        return self._chain.head

    def _altered(self, record: dict[str, Any]) -> None:
        """A chained record whose prev is not the hash of what precedes it: name the
        lines whose Adler-32 in the seal differs, else the stretch it covers."""
        seq = record.get("seq")
        previous = self._previous
        if previous is None:
            self._findings.append(
                (-1, _finding(record, f"{describe(record)} does not start the chain"))
            )
            return
        if not self._block:
            message = (
                f"{describe(previous)} was altered: its sha256 is not the prev of record {seq}"
            )
            self._findings.append((-1, _finding(previous, message)))
            return
        checksums = record.get("adler32")
        checksums = checksums if isinstance(checksums, list) and isinstance(seq, int) else []
        first = (seq if isinstance(seq, int) else 0) - len(checksums)  # seq of the first
        named = False
        for line_seq, checksum, altered in self._block:
            at = line_seq - first
            if 0 <= at < len(checksums) and checksums[at] != checksum:
                message = (
                    f"{describe(altered)} was altered: its Adler-32 is not the one "
                    f"{describe(record)} holds, nor the sha256 of its lines its prev"
                )
                self._findings.append((-1, _finding(altered, message)))
                named = True
        if not named:
            first_record = self._block[0][2]
            message = (
                f"a record from {describe(previous)} to the one before {describe(record)} "
                "was altered: their sha256 is not its prev"
            )
            self._findings.append((-1, _finding(first_record, message)))

    def finish(self) -> list[Finding]:
        """The findings in archive order."""
        findings = []
        for seq, finding in self._findings:
            if seq < 0:
                findings.append(finding)
                continue
            record = self._gaps[seq][1]
            if seq in self._moved:
                message = f"{describe(record)} is out of order: record {seq} belongs here"
            else:
                message = f"record {seq} is missing, before {describe(record)}"
            findings.append(_finding(record, message))
        return findings


def check_chain(lines: list[tuple[bytes, dict[str, Any]]]) -> tuple[list[Finding], str]:
    """Findings in archive order, and the head hash (of the last line)."""
    checker = ChainChecker()
    for line, record in lines:
        checker.feed(line, record)
    return checker.finish(), checker.head
