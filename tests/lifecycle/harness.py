"""Drive the lifecycle in-process, step by step: the Advancer plus Python task functions.

No listener loop and no threads: each ``pump`` round reads the lifecycle
stream, advances, then answers every start-task with the task function. The
same task functions run in flowlang's in-memory runner, so results compare.
"""

from __future__ import annotations

from typing import Any

import orjson
import redis

from flowlang.graph import Graph
from flowlang.runner import TaskCall
from lifecycle import events as ev
from lifecycle.engine.advance import Advancer
from lifecycle.engine.commit import Commit
from lifecycle.engine.store import GraphCache, WorkflowRecord, load_workflow
from lifecycle.events import end_task
from lifecycle.keys import TASK_GROUP, Keys
from lifecycle.submit import graph_task_kinds, start_workflow


class ScriptOnly(Advancer):
    """Every batch loses its watched transaction (as after a race with another worker):
    every workflow is committed by advance.lua, its gate in a MULTI of its own."""

    def _commit_watched(
        self, commits: list[Commit], extra_acks: list[str], send: Any
    ) -> list[bool | redis.ResponseError]:
        send([("UNWATCH",)])
        return [False] * len(commits)


def decode(fields: dict[bytes, bytes]) -> dict[str, Any]:
    return {k.decode(): orjson.loads(v) for k, v in fields.items()}


def direct_admissions(client: redis.Redis, keys: Keys, kind: str = "default") -> list[str]:
    """The workflows the concurrency gate admitted in their own commits, in order: those
    of the start-tasks it marked admitted (each such admission sends at least one)."""
    found: list[str] = []
    for _, fields in client.xrange(keys.tasks(kind)):
        event = decode(fields)
        if event.get(ev.ADMITTED) is True and event["workflow"] not in found[-1:]:
            found.append(event["workflow"])
    return found


def admitted_workflows(client: redis.Redis, keys: Keys, kind: str = "default") -> list[str]:
    """Every admission under a concurrency key: those the gate carried out in a
    workflow's own commit, then those written as admit-workflow events."""
    plain = [
        event["workflow"]
        for event in (decode(fields) for _, fields in client.xrange(keys.lifecycle))
        if event["kind"] == ev.ADMIT_WORKFLOW
    ]
    return direct_admissions(client, keys, kind) + plain


class Harness:
    def __init__(
        self, client: redis.Redis, keys: Keys | None = None, *, pack_starts: bool = False
    ) -> None:
        self.client = client
        self.keys = keys or Keys()
        self.advancer = Advancer(client, self.keys, pack_starts=pack_starts)
        self.graphs = GraphCache(client, self.keys)
        self.kinds: set[str] = set()
        self._group(self.keys.lifecycle, self.keys.lifecycle_group)

    def _group(self, stream: str, group: str) -> None:
        try:
            self.client.xgroup_create(stream, group, id="0", mkstream=True)
        except redis.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise

    def submit(self, graph: Graph, input: Any = None, workflow_id: str | None = None) -> str:
        for kind in graph_task_kinds(graph) - self.kinds:
            self._group(self.keys.tasks(kind), TASK_GROUP)
            self.kinds.add(kind)
        return start_workflow(self.client, graph, input, workflow_id, self.keys)

    def advance(self) -> int:
        """One lifecycle batch; returns the number of events read."""
        reply = self.client.xreadgroup(
            self.keys.lifecycle_group, "harness", {self.keys.lifecycle: ">"}, count=500
        )
        entries = [(i.decode(), decode(f)) for _, items in reply or [] for i, f in items]
        if entries:
            result = self.advancer.apply(entries)
            done = result.duplicates + [event_id for event_id, _ in result.rejected]
            if done:
                self.client.xack(self.keys.lifecycle, self.keys.lifecycle_group, *done)
        return len(entries)

    def work(self, task: Any) -> int:
        """Answer every waiting start-task with ``task(TaskCall)``; returns how many."""
        streams = {self.keys.tasks(kind): ">" for kind in self.kinds}
        reply = self.client.xreadgroup(TASK_GROUP, "harness", streams, count=500)
        answered = 0
        for stream, items in reply or []:
            for entry_id, fields in items:
                event = decode(fields)
                if event["kind"] == ev.START_TASKS:
                    starts = ev.unpacked_starts(entry_id.decode(), event)
                else:
                    starts = [event]
                for start in starts:
                    self._answer(start, task)
                self.client.xack(stream, TASK_GROUP, entry_id)
                answered += len(starts)
        return answered

    def _answer(self, event: dict[str, Any], task: Any) -> None:
        node = self.graphs.machine(self._digest(event["workflow"])).graph.nodes[event["index"]]
        call = TaskCall(
            event["name"],
            event["input"],
            event["parameters"],
            event["key"],
            event["attempt"],
            str(node.kind),
        )
        try:
            answer = end_task(event, task(call), worker="harness")
        except Exception as error:  # the task's failure becomes a FAILURE end-task
            answer = end_task(event, error=str(error), worker="harness")
        self.client.xadd(self.keys.lifecycle, {k: orjson.dumps(v) for k, v in answer.items()})

    def _digest(self, workflow_id: str) -> str:
        return self.client.hget(self.keys.workflow(workflow_id), "g").decode()

    def pump(self, task: Any, rounds: int = 1000) -> None:
        for _ in range(rounds):
            if not self.advance() + self.work(task):
                return
        raise AssertionError(f"still busy after {rounds} rounds")

    def run(self, graph: Graph, task: Any, input: Any = None) -> WorkflowRecord:
        workflow_id = self.submit(graph, input)
        self.pump(task)
        return load_workflow(self.client, self.keys, workflow_id)
