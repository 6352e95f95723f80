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

from lifecycle.archive import GENESIS, id_order, line_hash

__all__ = ["Finding", "check_chain", "describe"]


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


def check_chain(lines: list[tuple[bytes, dict[str, Any]]]) -> tuple[list[Finding], str]:
    """Findings in archive order, and the head hash (of the last line)."""
    findings: list[Finding] = []
    present = {record.get("seq") for _, record in lines}
    expected, prev_hash = 0, GENESIS
    previous: dict[str, Any] | None = None
    last_id: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}
    for line, record in lines:
        seq = record.get("seq")
        if seq != expected:
            if expected in present:
                message = f"{describe(record)} is out of order: record {expected} belongs here"
            else:
                message = f"record {expected} is missing, before {describe(record)}"
            findings.append(_finding(record, message))
        elif record.get("prev") != prev_hash and previous is not None:
            findings.append(
                _finding(
                    previous,
                    f"{describe(previous)} was altered: its sha256 is not the prev of record {seq}",
                )
            )
        elif record.get("prev") != prev_hash:
            findings.append(_finding(record, f"{describe(record)} does not start the chain"))
        stream, entry_id = record.get("stream"), record.get("id")
        if isinstance(stream, str) and isinstance(entry_id, str):
            order = id_order(entry_id)
            before = last_id.get(stream)
            if before is not None and order <= before[0]:
                findings.append(
                    _finding(
                        record,
                        f"{describe(record)} follows entry {before[1].get('id')} of its stream: "
                        "entries are duplicated or out of order",
                    )
                )
            last_id[stream] = (order, record)
        expected = seq + 1 if isinstance(seq, int) else expected + 1
        prev_hash = line_hash(line)
        previous = record
    return findings, prev_hash
