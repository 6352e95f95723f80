"""Recover: bring back from the archive the workflows Redis lost.

The archive is the second copy of every event. After Redis lost writes it had
acknowledged (a host crash that cut the AOF tail, a failover to a lagging
replica, a restore from an old snapshot), replay finds the workflows the
archive knows but Redis does not hold, or holds at an older point
(:data:`lifecycle.replay.BEHIND`). For each, recover writes the record the
replay rebuilt — state, task records, graph, index entry, pending timers — and
sends again the start-task of every task that was running, with its original
attempt and token, so the workflow finishes. Task workers may run such a task a
second time (execution is at-least-once); the token makes the engine take one
answer only, so the workflow advances exactly once.

A workflow is written only if Redis still holds what replay compared it with
(WATCH): one advanced by a live lifecycle worker meanwhile is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis

from flowlang.limits import DEFAULT_LIMITS, Limits
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.audit.replay import NOT_IN_REDIS, WorkflowReplay
from lifecycle.audit.report import AuditReport, audit_archive
from lifecycle.engine.commit import Commit
from lifecycle.engine.gate import gate_command
from lifecycle.keys import Keys
from lifecycle.priorities import priority_member

__all__ = ["RecoverReport", "recover"]


@dataclass
class RecoverReport:
    audit: AuditReport
    restored: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (workflow, why)
    resent: int = 0  # start-tasks sent again

    def summary(self) -> dict[str, Any]:
        return {
            "restored": len(self.restored),
            "resent_start_tasks": self.resent,
            "skipped": [{"workflow": w, "reason": why} for w, why in self.skipped],
            "replayed": self.audit.replayed,
            "diverged": len(self.audit.diverged),
        }


def recover(
    client: redis.Redis,
    directory: str | Path,
    keys: Keys | None = None,
    *,
    workflow: str | None = None,
    dry_run: bool = False,
    limits: Limits = DEFAULT_LIMITS,
) -> RecoverReport:
    """Replay the archive against Redis (with the lifecycle workers' ``limits``) and
    restore every workflow lost in Redis."""
    keys = keys or Keys()
    audit = audit_archive(
        directory, keys, workflow=workflow, client=client, keep=False, limits=limits
    )
    report = RecoverReport(audit)
    for item in audit.lost:
        if item.divergence is not None:
            report.skipped.append((item.workflow, f"replay diverged: {item.divergence}"))
            continue
        if item.state is None or item.graph is None:
            report.skipped.append((item.workflow, "the archive never started it"))
            continue
        if dry_run:
            report.restored.append(item.workflow)
            continue
        resent = _restore(client, keys, item, audit.graph_texts.get(item.graph))
        if resent is None:
            report.skipped.append((item.workflow, "advanced in Redis while recovering"))
        else:
            report.restored.append(item.workflow)
            report.resent += resent
    return report


def _restore(
    client: redis.Redis, keys: Keys, item: WorkflowReplay, graph_text: str | None
) -> int | None:
    """Write ``item``'s replayed record; return how many start-tasks were sent again, or
    None when its record changed since replay compared it (nothing written)."""
    assert item.state is not None
    key = keys.workflow(item.workflow)
    running = _running_start_tasks(item)
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(key)
            seen = pipe.hget(key, rec.VERSION)
            if isinstance(seen, bytes):
                seen = seen.decode()
            if seen != item.live_version:  # advanced (or created) since replay compared it
                return None
            pipe.multi()
            if graph_text is not None:
                pipe.set(keys.graph(str(item.graph)), graph_text, nx=True)
            pipe.delete(key)
            pipe.hset(key, mapping=item.fields)  # type: ignore[arg-type]  # values: bytes, str, int
            created = item.fields.get(rec.CREATED)
            if created is not None:
                pipe.zadd(keys.workflows, {item.workflow: int(created)})
            if item.timers:
                pipe.zadd(keys.timers, item.timers)
            if item.live == NOT_IN_REDIS and item.state.status != rec.RUNNING:
                pipe.hincrby(keys.outcomes, item.state.status, 1)
                _ended_again(client, pipe, keys, item)
            if item.state.status == rec.RUNNING:
                _place_again(pipe, keys, item)
            for stream, event in running:
                priority = event.get("priority")
                if isinstance(priority, int) and priority:
                    # Workers find a priority's stream through {flow}:priorities, which
                    # went with the Redis that was lost.
                    kind = str(stream)[len(keys.tasks("")) :].partition(":")[0]
                    pipe.sadd(keys.priorities, priority_member(kind, priority))
                fields = {name: orjson.dumps(value) for name, value in event.items()}
                fields[ev.RECOVERED] = b"true"  # replay: the same start-task, sent again
                pipe.xadd(stream, fields)  # type: ignore[arg-type]
            pipe.execute()
        except redis.WatchError:
            return None
    return len(running)


def _ended_again(client: redis.Redis, pipe: Any, keys: Keys, item: WorkflowReplay) -> None:
    """What the commit that ended a restored workflow did besides its record: its place
    in retention's schedule, and its stop record unless it finished."""
    assert item.state is not None
    retain, ended = client.get(keys.retention), item.fields.get(rec.ENDED)
    if retain and int(retain) > 0 and ended is not None:
        pipe.zadd(keys.expiring, {item.workflow: int(ended) + int(retain)})
    if item.state.status != rec.FINISHED:
        pipe.hset(keys.stopped, item.workflow, orjson.dumps(item.state.stopped))


def _place_again(pipe: Any, keys: Keys, item: WorkflowReplay) -> None:
    """A running workflow under a concurrency key takes its place again (the sets went
    with the Redis that was lost): admitted, or in line at its creation time, admitted
    now if there is room (gate.lua)."""
    raw = item.fields.get(rec.CONCURRENCY)
    concurrency = orjson.loads(raw) if raw is not None else None
    if not isinstance(concurrency, dict):
        return
    key, most = str(concurrency.get("key")), int(concurrency.get("max") or 1)
    if concurrency.get("queued") is not True:
        pipe.sadd(keys.key_running(key), item.workflow)
        return
    place = Commit(keys, item.workflow)
    place.enter(key, most, int(item.fields.get(rec.CREATED) or 0) * 1000)
    gate = gate_command([place])  # no version written: no version checked
    assert gate is not None
    pipe.execute_command(*gate)


def _running_start_tasks(item: WorkflowReplay) -> list[tuple[str, dict[str, Any]]]:
    """The start-task of each attempt the replayed state has running: as archived (one
    in a start-tasks pack goes alone), or as replay computed it where the archive stops
    before it was sent."""
    assert item.state is not None
    wanted = {(key, attempt) for key, attempt in item.state.running.items()}
    found = []
    emitted = [(stream, event) for stream, _, event in item.emitted] + item.unarchived
    for stream, event in emitted:
        instance = (event.get("key"), event.get("attempt"))
        if event.get("kind") == ev.START_TASK and instance in wanted:
            wanted.discard(instance)  # once: recover's own resends are archived too
            found.append((stream, event))
    return found
