"""Tamper evidence: check an archive's hash chain and each stream's id order.

Each record names the sha256 of the line before it and its own ``seq``; a
changed line no longer matches the ``prev`` of its successor, a dropped one
leaves a hole in ``seq``, a moved one stands where another ``seq`` belongs.
Within one stream entry ids must strictly increase (the worker archives each
stream in id order), so a duplicated or reordered entry is caught even where
someone recomputed the chain. What no chain catches — an archive rewritten
from the altered record to its end — replay's semantic check still can (the
transitions no longer match the archived start-tasks), and comparing the head
hash with one kept elsewhere always does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lifecycle.audit.archive import GENESIS, id_order, line_hash

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

    def __init__(self) -> None:
        self.expected, self.head = 0, GENESIS
        self._previous: dict[str, Any] | None = None
        self._last_id: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}
        self._gaps: dict[int, tuple[int, dict[str, Any]]] = {}  # seq -> (order, record)
        self._moved: set[int] = set()  # gaps whose record turned up later
        self._findings: list[tuple[int, Finding]] = []

    def feed(self, line: bytes, record: dict[str, Any]) -> None:
        order = len(self._findings)
        seq = record.get("seq")
        if isinstance(seq, int) and seq in self._gaps:
            self._moved.add(seq)
        if seq != self.expected:
            self._gaps[self.expected] = (order, record)
            self._findings.append((self.expected, Finding("")))  # resolved in finish()
        elif record.get("prev") != self.head and self._previous is not None:
            previous = self._previous
            message = (
                f"{describe(previous)} was altered: its sha256 is not the prev of record {seq}"
            )
            self._findings.append((-1, _finding(previous, message)))
        elif record.get("prev") != self.head:
            self._findings.append(
                (-1, _finding(record, f"{describe(record)} does not start the chain"))
            )
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
        self.head = line_hash(line)
        self._previous = record

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
