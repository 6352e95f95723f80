"""Audit an archive: check its chain, replay every workflow, compare with live Redis.

:func:`audit_archive` is what ``python -m lifecycle replay`` runs and what the
tests call; it returns an :class:`AuditReport` whose ``ok`` is the exit status.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from flowlang.limits import DEFAULT_LIMITS, Limits
from lifecycle import events as ev
from lifecycle.audit.archive import ArchiveProblem, iter_archive
from lifecycle.audit.replay import (
    BEHIND,
    NOT_IN_REDIS,
    ArchiveGraphs,
    WorkflowReplay,
    compare_live,
    replay_workflow,
)
from lifecycle.audit.verify import ChainChecker, Finding, describe
from lifecycle.errors import BadEvent
from lifecycle.keys import Keys

__all__ = ["AuditReport", "audit_archive"]

_EMITTED = {ev.START_TASK, ev.END_WORKFLOW, ev.FAILED_WORKFLOW}


# A workflow is replayed once this many records have passed since its end: what it
# emitted on other streams may be archived a little after its end-workflow (the
# receipts worker reads several streams), and late answers change nothing.
_SETTLE_RECORDS = 10_000


@dataclass
class AuditReport:
    records: int = 0
    head: str = ""
    streams: Counter[str] = field(default_factory=Counter)  # entries archived per stream
    gone: int = 0  # entries deleted before archiving (gaps the archive admits)
    chain: list[Finding] = field(default_factory=list)
    workflows: list[WorkflowReplay] = field(default_factory=list)  # those kept
    states: Counter[str] = field(default_factory=Counter)  # every workflow replayed
    live: Counter[str] = field(default_factory=Counter)
    replayed: int = 0
    late: int = 0  # inputs archived after their workflow was replayed (they change nothing)
    graph_texts: dict[str, str] = field(default_factory=dict)  # digest -> compiled graph JSON

    @property
    def diverged(self) -> list[WorkflowReplay]:
        return [w for w in self.workflows if w.divergence is not None]

    @property
    def lost(self) -> list[WorkflowReplay]:
        """Workflows the archive knows that Redis lost, or holds at an older point."""
        return [w for w in self.workflows if w.live in (NOT_IN_REDIS, BEHIND)]

    @property
    def ok(self) -> bool:
        return not self.chain and not self.diverged

    @property
    def first_problem(self) -> Finding | None:
        if self.chain:
            return self.chain[0]
        return self.diverged[0].divergence if self.diverged else None

    def add(self, item: WorkflowReplay, keep: bool) -> None:
        self.replayed += 1
        self.states[item.shown_state] += 1
        self.live[item.live] += 1
        if keep or item.divergence is not None or item.live in (NOT_IN_REDIS, BEHIND):
            self.workflows.append(item)

    def summary(self) -> dict[str, Any]:
        problem = self.first_problem
        return {
            "ok": self.ok,
            "records": self.records,
            "head": self.head,
            "entries_per_stream": dict(self.streams),
            "deleted_before_archived": self.gone,
            "workflows": self.replayed,
            "states": dict(self.states),
            "live": dict(self.live),
            "diverged": len(self.diverged),
            "lost_in_redis": len(self.lost),
            "chain_findings": [f.message for f in self.chain],
            "first_problem": problem.message if problem else None,
            "first_problem_workflow": problem.workflow if problem else None,
            "first_problem_event": problem.event if problem else None,
        }


def audit_archive(
    directory: str | Path,
    keys: Keys | None = None,
    *,
    workflow: str | None = None,
    client: redis.Redis | None = None,
    keep: bool = True,
    limits: Limits = DEFAULT_LIMITS,
) -> AuditReport:
    """Check the chain of the archive in ``directory``, replay its workflows (or one) and,
    with ``client``, compare each with its live record. Raises ArchiveError when the
    archive cannot be read at all.

    The archive is streamed: a workflow is replayed shortly after its end and then
    dropped, so memory follows the workflows open at a point of the archive, not its
    size. With ``keep`` False only the workflows with a problem stay in
    ``report.workflows`` (the counts cover all). ``limits``: those the lifecycle workers
    ran with (an iteration's window decides which of its items start when)."""
    keys = keys or Keys()
    report = AuditReport()
    checker = ChainChecker()
    graphs = ArchiveGraphs(limits)
    open_: dict[str, WorkflowReplay] = {}
    ended: deque[tuple[int, str]] = deque()  # (record number, workflow) in end order

    def settle(item: WorkflowReplay) -> None:
        if not item.emitted and all(e[2].get("kind") != ev.START_WORKFLOW for e in item.inputs):
            report.late += len(item.inputs)  # answers archived after their workflow settled
            return
        try:
            replay_workflow(item, graphs, keys)
            if client is not None:
                compare_live(client, keys, item)
        except Exception as error:  # noqa: BLE001 - one workflow's replay never stops the audit
            item.diverge("", None, f"workflow {item.workflow}: replay failed: {error}")
        report.add(item, keep)

    for number, read in enumerate(iter_archive(directory)):
        if isinstance(read, ArchiveProblem):  # kept as evidence; the chain check says more
            report.chain.append(Finding(f"archive line {read}"))
            continue
        line, record = read.line, read.record
        report.records += 1
        checker.feed(line, record)
        while ended and ended[0][0] + _SETTLE_RECORDS <= number:
            item = open_.pop(ended.popleft()[1], None)
            if item is not None:
                settle(item)
        if "graph" in record:
            problem = graphs.add(str(record["graph"]), str(record.get("text", "")))
            if problem is not None:
                report.chain.append(Finding(f"{describe(record)}: {problem}"))
            continue
        stream = record.get("stream")
        if not isinstance(stream, str):
            continue
        report.streams[stream] += 1
        event = record.get("event")
        if event is None:
            report.gone += 1
            continue
        for one in _events(stream, str(record["id"]), event, keys):
            name = one.get("workflow")
            if not isinstance(name, str) or (workflow is not None and name != workflow):
                continue
            item = open_.get(name)
            if item is None:
                item = open_[name] = WorkflowReplay(name)
            entry = (stream, str(record["id"]), one)
            kind = one.get("kind")
            if stream == keys.lifecycle and kind in ev.LIFECYCLE_INPUTS:
                item.inputs.append(entry)
            elif kind in _EMITTED:
                item.emitted.append(entry)
                if kind != ev.START_TASK:
                    ended.append((number, name))
    for item in open_.values():
        settle(item)
    report.graph_texts = graphs.texts
    report.chain[:0] = checker.finish()
    report.head = checker.head
    return report


def _events(stream: str, entry_id: str, event: Any, keys: Keys) -> list[dict[str, Any]]:
    """The events an archived entry stands for: itself, the answers an end-tasks entry
    packs (each then an input of its own workflow), or the start-tasks a start-tasks
    entry on a task stream packs (each then emitted for its own workflow); a packed
    one under the entry's id."""
    if not isinstance(event, dict):
        return []
    kind = event.get("kind")
    try:
        if stream == keys.lifecycle and kind == ev.END_TASKS:
            return ev.unpacked_answers(entry_id, event)
        if stream != keys.lifecycle and kind == ev.START_TASKS:
            return ev.unpacked_starts(entry_id, event)
    except BadEvent:
        # Answers so written were dead-lettered live, changing nothing. Start-tasks so
        # written (or a malformed one, left out) are missing: replay says where.
        return []
    return [event]
