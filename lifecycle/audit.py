"""Audit an archive: check its chain, replay every workflow, compare with live Redis.

:func:`audit_archive` is what ``python -m lifecycle replay`` runs and what the
tests call; it returns an :class:`AuditReport` whose ``ok`` is the exit status.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from lifecycle import events as ev
from lifecycle.archive import read_archive
from lifecycle.keys import Keys
from lifecycle.replay import ArchiveGraphs, WorkflowReplay, compare_live, replay_workflow
from lifecycle.verify import Finding, check_chain, describe

__all__ = ["AuditReport", "audit_archive"]

_EMITTED = {ev.START_TASK, ev.END_WORKFLOW, ev.FAILED_WORKFLOW}


@dataclass
class AuditReport:
    records: int = 0
    head: str = ""
    streams: Counter[str] = field(default_factory=Counter)  # entries archived per stream
    gone: int = 0  # entries deleted before archiving (gaps the archive admits)
    chain: list[Finding] = field(default_factory=list)
    workflows: list[WorkflowReplay] = field(default_factory=list)

    @property
    def diverged(self) -> list[WorkflowReplay]:
        return [w for w in self.workflows if w.divergence is not None]

    @property
    def ok(self) -> bool:
        return not self.chain and not self.diverged

    @property
    def first_problem(self) -> Finding | None:
        if self.chain:
            return self.chain[0]
        return self.diverged[0].divergence if self.diverged else None

    def summary(self) -> dict[str, Any]:
        live = Counter(w.live for w in self.workflows)
        states = Counter(w.state.status if w.state else "never started" for w in self.workflows)
        problem = self.first_problem
        return {
            "ok": self.ok,
            "records": self.records,
            "head": self.head,
            "entries_per_stream": dict(self.streams),
            "deleted_before_archived": self.gone,
            "workflows": len(self.workflows),
            "states": dict(states),
            "live": dict(live),
            "diverged": len(self.diverged),
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
) -> AuditReport:
    """Check the chain of the archive in ``directory``, replay its workflows (or one) and,
    with ``client``, compare each with its live record. Raises ArchiveError when the
    archive cannot be read at all."""
    keys = keys or Keys()
    lines = list(read_archive(directory))
    report = AuditReport(records=len(lines))
    report.chain, report.head = check_chain(lines)
    graphs = ArchiveGraphs()
    by_workflow: dict[str, WorkflowReplay] = {}
    for _, record in lines:
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
        name = event.get("workflow")
        if not isinstance(name, str) or (workflow is not None and name != workflow):
            continue
        item = by_workflow.get(name)
        if item is None:
            item = by_workflow[name] = WorkflowReplay(name)
        entry = (stream, str(record["id"]), event)
        kind = event.get("kind")
        if stream == keys.lifecycle and kind in ev.LIFECYCLE_INPUTS:
            item.inputs.append(entry)
        elif kind in _EMITTED:
            item.emitted.append(entry)
    for item in by_workflow.values():
        replay_workflow(item, graphs, keys)
        if client is not None:
            compare_live(client, keys, item)
    report.workflows = list(by_workflow.values())
    return report
