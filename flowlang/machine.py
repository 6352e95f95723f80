"""How a workflow advances (FLOWLANG.md §6–§8): one transition function, many callers.

:class:`Machine` is bound to a compiled :class:`Graph` and holds no workflow
state of its own. Every transition takes a :class:`State` (plain JSON data,
so an engine can store it anywhere), changes it, and returns the actions the
caller must carry out: tasks to start, the workflow finished or failed. The
in-memory runner and the Redis lifecycle both drive this same code, and so
does replay.

A node *instance* is a node at an iteration path: ``(node, (i, j, ...))``,
one index per enclosing iteration. Its key is ``"node"`` or ``"node.i.j"``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flowlang.data import DataError, GuardBudgetExceeded, gather, guard_matches, merge
from flowlang.graph import Graph, NodeKind, downstream, nodes_on_cycles
from flowlang.limits import DEFAULT_LIMITS, GuardTimeout, LimitExceeded, Limits, RunawayLoop
from flowlang.state import FAILED, FINISHED, RUNNING, TERMINATED, ChunkedState, Missing, State

__all__ = [
    "FAILED",
    "FINISHED",
    "RUNNING",
    "TERMINATED",
    "ChunkedState",
    "Failed",
    "Finished",
    "Machine",
    "Missing",
    "StartTask",
    "State",
    "instance_key",
    "parse_key",
]

Path = tuple[int, ...]
Arrival = tuple[int, Path, int | None, Any]  # (node, path, predecessor, value)
Trace = list[tuple[str, str]] | None


def instance_key(node: int, path: Path) -> str:
    if not path:
        return str(node)
    return f"{node}." + ".".join(map(str, path))


def parse_key(key: str) -> tuple[int, Path]:
    if "." not in key:  # outside any iteration: most keys
        return int(key), ()
    node, *path = key.split(".")
    return int(node), tuple(int(i) for i in path)


@dataclass(slots=True)
class StartTask:
    """Start a task instance: a TASK node, or a URI source/sink to load or store.

    Not changed once made, but not ``frozen``: one is made per task started, and a
    frozen dataclass sets each field through ``object.__setattr__`` (4x the cost)."""

    key: str
    attempt: int
    node: int
    name: str
    kind: str  # "task", "source" or "sink"
    input: Any
    params: Any
    path: Path


@dataclass(slots=True, frozen=True)
class Finished:
    output: Any


@dataclass(slots=True, frozen=True)
class Failed:
    reason: str
    key: str | None = None


Action = StartTask | Finished | Failed


class _Failure(Exception):
    def __init__(self, reason: str, key: str | None) -> None:
        super().__init__(reason)
        self.reason, self.key = reason, key


class Machine:
    """The transition function of one compiled flow.

    ``trace``, when a list is passed to a transition, receives ``(event, key)``
    tuples — ``"start"``, ``"skip"``, ``"end"`` — for every node instance, in
    order: what the runner's traces and the engine's history are made of.

    ``limits`` bound the work of one transition: visits of nodes on a cycle
    (:class:`RunawayLoop`), items of one iteration and task instances started by one
    workflow (:class:`LimitExceeded`), the time of one guard (:class:`GuardTimeout`).
    A transition that breaks one raises it (a :class:`FlowError` placed at the node)
    and leaves the state half changed: the caller fails the workflow.
    """

    def __init__(self, graph: Graph, limits: Limits = DEFAULT_LIMITS) -> None:
        self.graph = graph
        self.limits = limits
        self.nodes = graph.nodes
        self.successors = [graph.successors(n.id) for n in graph.nodes]
        self.threshold: list[int] = []
        self.inner: list[frozenset[int]] = []  # for start kinds: predecessors inside their scope
        for node in graph.nodes:
            preds = graph.predecessors(node.id)
            if node.kind is NodeKind.START:
                inner = frozenset(preds)
                threshold = 1
            elif node.kind is NodeKind.SUBFLOW_START:
                inner = frozenset(p for p in preds if graph.nodes[p].parent == node.id)
                threshold = max(1, len(preds) - len(inner))
            else:
                inner, threshold = frozenset(), max(1, len(preds))
            self.inner.append(inner)
            self.threshold.append(threshold)
        self.on_cycle = nodes_on_cycles(self.successors)
        self._inside_of: dict[int, frozenset[int]] = {}  # subflow start -> nodes inside it
        self.cyclic = downstream(self.on_cycle, self.successors)
        # Per node: its successors when every one is a plain task (one predecessor, no
        # guard, merge or iteration, not on or after a cycle), else None. Ending such a
        # node only starts them with its output: task_ended() then skips the arrival
        # queue, which is most of the per-step cost of a chain.
        self.plain_next: list[tuple[int, ...] | None] = [
            tuple(succ) if succ and not node.iterate and all(map(self._plain_task, succ)) else None
            for node, succ in zip(graph.nodes, self.successors, strict=True)
        ]
        # Whether a workflow's state may be kept entry by entry (flowlang.state.ChunkedState):
        # only in a graph without cycles, where an instance starts once.
        self.chunkable = not self.on_cycle

    # -- transitions -------------------------------------------------------------

    def start(self, state: State, input: Any = None, trace: Trace = None) -> list[Action]:
        """Start the workflow. No input (or ``{}``) means the `@flow` parameters."""
        if input is None or input == {}:
            input = self.graph.params if self.graph.params is not None else {}
        return self._run(state, deque(), trace, first=(self.graph.start, (), None, input))

    def task_ended(
        self, state: State, key: str, attempt: int, output: Any, trace: Trace = None
    ) -> list[Action]:
        """A task instance ended. A duplicate or stale end changes nothing and returns []."""
        if state.status != RUNNING or state.running.get(key) != attempt:
            return []
        del state.running[key]
        node, path = parse_key(key)
        if output is None:
            output = {}
        plain = self.plain_next[node]
        if plain is not None and trace is None:
            # What the arrival queue would do for plain successors, in the same order.
            if self.limits.task_starts is not None:
                self._count_starts(state, plain[0], len(plain))
            started: list[Action] = []
            for successor in plain:
                successor_key = instance_key(successor, path)
                state.running[successor_key] = 1
                started.append(self._task_action(successor, path, successor_key, 1, output))
            return started
        if trace is not None:
            trace.append(("end", key))
        work: deque[Arrival] = deque()
        next_items: list[Action] = []  # an item that ends starts the next one queued
        if self.nodes[node].iterate:
            self._collect(state, node, path, output, work, next_items, trace)
        else:
            self._ended(state, node, path, output, work, trace)
        return self._run(state, work, trace, actions=next_items)

    def task_failed(
        self,
        state: State,
        key: str,
        attempt: int,
        reason: str,
        retry: bool = False,
        input: Any = None,
    ) -> list[Action]:
        """A task instance failed. With ``retry`` it starts again as ``attempt + 1`` with
        ``input`` (task inputs are not kept in the state: the caller has them)."""
        if state.status != RUNNING or state.running.get(key) != attempt:
            return []
        node, path = parse_key(key)
        if retry:
            state.running[key] = attempt + 1
            if node in self.cyclic:
                state.attempts[key][1] = attempt + 1
            return [self._task_action(node, path, key, attempt + 1, input)]
        del state.running[key]
        name = self.nodes[node].name or self.nodes[node].kind
        actions = self._fail(state, _Failure(f"task {name} ({key}) failed: {reason}", key))
        state.stopped[key] = attempt
        return actions

    def invocation_attempt(self, state: State, key: str, attempt: int) -> int:
        """Which try of the current invocation ``attempt`` is (1 = the first): what retry
        policies count. Equal to ``attempt`` except for tasks on or after a cycle."""
        first = state.attempts.get(key)
        if first is None:
            return attempt
        return attempt - first[0] + 1

    def terminate(self, state: State, reason: str = "terminated") -> None:
        if state.status == RUNNING:
            state.need_whole()
            state.status, state.error = TERMINATED, reason
            state.stopped = dict(state.running)
            state.running.clear()

    def restart(self, state: State, inputs: Mapping[str, Any]) -> list[Action]:
        """A failed or terminated workflow runs on from where it stopped: each task instance
        that was running or failed then starts again as its next attempt (``inputs``: their
        inputs, by key), with a fresh retry budget; what ended well is not run again, and
        what waited still waits. [] when nothing was left to start (it failed outside any
        task): the caller refuses the restart."""
        if state.status not in (FAILED, TERMINATED) or not state.stopped:
            return []
        state.need_whole()
        actions: list[Action] = []
        for key, attempt in sorted(state.stopped.items(), key=lambda item: _key_order(item[0])):
            node, path = parse_key(key)
            state.running[key] = attempt + 1
            # Retries count from here: invocation_attempt() reads the first attempt.
            state.attempts[key] = [attempt + 1, attempt + 1]
            actions.append(self._task_action(node, path, key, attempt + 1, inputs.get(key)))
        state.status, state.error, state.stopped = RUNNING, None, {}
        return actions

    # -- internals ---------------------------------------------------------------

    def _plain_task(self, node: int) -> bool:
        spec = self.nodes[node]
        return (
            spec.kind is NodeKind.TASK
            and self.threshold[node] == 1
            and not spec.merge
            and spec.guard is None
            and not spec.iterate
            and node not in self.cyclic
        )

    def _run(
        self,
        state: State,
        queue: deque[Arrival],
        trace: Trace,
        first: Arrival | None = None,
        actions: list[Action] | None = None,
    ) -> list[Action]:
        """Deliver arrivals until none is left; then check whether the workflow is done.
        ``actions``: those already taken in this transition."""
        if actions is None:
            actions = []
        try:
            if first is not None:
                node, path, _, value = first
                self._start(state, node, path, [value], queue, actions, trace)
            if self.on_cycle:
                self._drain_counting(state, queue, actions, trace)
            while queue:
                node, path, pred, value = queue.popleft()
                self._arrive(state, node, path, pred, value, queue, actions, trace)
        except _Failure as failure:
            return [a for a in actions if not isinstance(a, StartTask)] + self._fail(state, failure)
        if state.status == RUNNING and not state.running:
            state.status = FINISHED
            actions.append(Finished(state.output))
        return actions

    def _drain_counting(
        self, state: State, queue: deque[Arrival], actions: list[Action], trace: Trace
    ) -> None:
        """The arrival loop of a graph with cycles: a loop that starts no task would
        deliver arrivals forever, so visits of nodes on a cycle are counted."""
        on_cycle, limit, visits = self.on_cycle, self.limits.visits, 0
        while queue:
            node, path, pred, value = queue.popleft()
            if node in on_cycle:
                visits += 1
                if visits > limit:
                    spec = self.nodes[node]
                    raise RunawayLoop(
                        f"runaway loop at {spec.describe()} ({instance_key(node, path)}): "
                        f"more than {limit:,} visits of nodes on a cycle in one step",
                        spec.line,
                        spec.column,
                    )
            self._arrive(state, node, path, pred, value, queue, actions, trace)

    def _arrive(
        self,
        state: State,
        node: int,
        path: Path,
        pred: int | None,
        value: Any,
        queue: deque[Arrival],
        actions: list[Action],
        trace: Trace,
    ) -> None:
        if pred in self.inner[node]:
            # A cycle back to its own scope's start restarts the scope at once: the
            # start's guard, merge and iteration applied when the scope was entered.
            if trace is not None:
                trace.append(("start", instance_key(node, path)))
            self._ended(state, node, path, value, queue, trace)
            return
        if self.threshold[node] == 1:
            self._start(state, node, path, [value], queue, actions, trace)
            return
        values = state.arrive(instance_key(node, path), pred, value, self.threshold[node])
        if values is not None:
            self._start(state, node, path, values, queue, actions, trace)

    def _start(
        self,
        state: State,
        node: int,
        path: Path,
        values: list[Any],
        queue: deque[Arrival],
        actions: list[Action],
        trace: Trace,
    ) -> None:
        spec = self.nodes[node]
        key = instance_key(node, path)
        value = gather(values)
        try:
            if spec.merge:
                value = merge(value)
            skip = spec.guard is not None and not guard_matches(
                spec.guard, value, self.limits.guard_ms
            )
        except GuardBudgetExceeded:
            raise GuardTimeout(
                f"{spec.describe()} ({key}): guard `{spec.guard}` took more than "
                f"{self.limits.guard_ms} ms on its input",
                spec.line,
                spec.column,
            ) from None
        except DataError as error:
            raise _Failure(self._where(node, key, str(error)), key) from None
        if skip:
            if trace is not None:
                trace.append(("skip", key))
            target = spec.pair if spec.kind is NodeKind.SUBFLOW_START else node
            assert target is not None
            self._ended(state, target, path, value, queue, trace)
            return
        if trace is not None:
            trace.append(("start", key))
        kind = spec.kind
        if (
            kind is NodeKind.TASK
            or (kind is NodeKind.SOURCE and spec.name)
            or kind is NodeKind.SINK
        ):
            if spec.iterate:
                self._fan_out(state, node, path, value, queue, actions, trace)
            else:
                if self.limits.task_starts is not None:
                    self._count_starts(state, node, 1)
                attempt = self._first_attempt(state, node, key)
                state.running[key] = attempt
                actions.append(self._task_action(node, path, key, attempt, value))
        elif kind is NodeKind.SOURCE:
            self._ended(
                state, node, path, spec.params if spec.params is not None else {}, queue, trace
            )
        elif kind is NodeKind.SUBFLOW_START and spec.iterate:
            self._fan_out(state, node, path, value, queue, actions, trace)
        elif kind is NodeKind.SUBFLOW_END and self.nodes[spec.pair or 0].iterate:
            self._collect(state, node, path, value, queue, actions, trace)
        else:
            if kind is NodeKind.END:
                state.output = value
            self._ended(state, node, path, value, queue, trace)

    def _fan_out(
        self,
        state: State,
        node: int,
        path: Path,
        value: Any,
        queue: deque[Arrival],
        actions: list[Action],
        trace: Trace,
    ) -> None:
        spec = self.nodes[node]
        key = instance_key(node, path)
        if not isinstance(value, list):
            raise _Failure(
                self._where(node, key, f"cannot iterate over {_kind_of(value)}: * needs a list"),
                key,
            )
        if len(value) > self.limits.items:
            raise LimitExceeded(
                f"{spec.describe()} ({key}): * over {len(value):,} items, more than the limit "
                f"of {self.limits.items:,}",
                spec.line,
                spec.column,
            )
        collector = spec.pair if spec.kind is NodeKind.SUBFLOW_START else node
        assert collector is not None
        collector_key = instance_key(collector, path)
        if node in self.cyclic and collector_key in state.fanin:
            self._supersede(state, node, path, len(state.fanin.pop(collector_key)[1]))
        if spec.kind is not NodeKind.SUBFLOW_START and self.limits.task_starts is not None:
            self._count_starts(state, node, len(value))
        if not value:
            self._ended(state, collector, path, [], queue, trace)
            return
        # At most `window` items run at once: each that ends starts the next (_collect).
        window = self.limits.window
        state.open_fanin(collector_key, len(value), value[window:])
        for index, item in enumerate(value[:window]):
            self._start_item(state, node, (*path, index), item, queue, actions, trace)

    def _start_item(
        self,
        state: State,
        node: int,
        item_path: Path,
        item: Any,
        queue: deque[Arrival],
        actions: list[Action],
        trace: Trace,
    ) -> None:
        """Item ``item_path[-1]`` of the iteration of ``node`` (a task or a subflow) starts."""
        if self.nodes[node].kind is NodeKind.SUBFLOW_START:
            self._ended(state, node, item_path, item, queue, trace)
            return
        item_key = instance_key(node, item_path)
        attempt = self._first_attempt(state, node, item_key)
        state.running[item_key] = attempt
        actions.append(self._task_action(node, item_path, item_key, attempt, item))

    def _supersede(self, state: State, node: int, path: Path, items: int) -> None:
        """Drop what is left of an iteration whose step a cycle invoked again before it
        ended: as for a task invoked again, the new invocation replaces the old one, whose
        late ends then find no running attempt. (Attempt numbers are kept, so the new
        items' task instance ids differ from the old ones'.)"""
        if self.nodes[node].kind is not NodeKind.SUBFLOW_START:
            for index in range(items):
                state.running.pop(instance_key(node, (*path, index)), None)
            return
        state.need_whole()
        inside, depth = self._inside(node), len(path)
        for table in (state.running, state.waiting, state.fanin):
            for key in list(table):
                inner, inner_path = parse_key(key)
                if inner in inside and len(inner_path) > depth and inner_path[:depth] == path:
                    del table[key]

    def _inside(self, start: int) -> frozenset[int]:
        """The nodes inside subflow ``start``, at any depth."""
        found = self._inside_of.get(start)
        if found is None:
            inside: set[int] = set()
            for spec in self.nodes:
                parent = spec.parent
                while parent is not None and parent != start:
                    parent = self.nodes[parent].parent
                if parent == start:
                    inside.add(spec.id)
            found = self._inside_of[start] = frozenset(inside)
        return found

    def _collect(
        self,
        state: State,
        node: int,
        item_path: Path,
        output: Any,
        queue: deque[Arrival],
        actions: list[Action],
        trace: Trace,
    ) -> None:
        """One item of an iteration ended: the next item waiting starts; when it was the
        last, the iterated step ends."""
        path = item_path[:-1]
        key = instance_key(node, path)
        outputs = state.collect(key, item_path[-1], output)
        if outputs is not None:
            self._ended(state, node, path, outputs, queue, trace)
            return
        waiting = state.next_item(key)
        if waiting is not None:
            index, item = waiting
            spec = self.nodes[node]
            iterated = spec.pair if spec.kind is NodeKind.SUBFLOW_END else node
            assert iterated is not None
            self._start_item(state, iterated, (*path, index), item, queue, actions, trace)

    def _ended(
        self, state: State, node: int, path: Path, output: Any, queue: deque[Arrival], trace: Trace
    ) -> None:
        for successor in self.successors[node]:
            queue.append((successor, path, node, output))

    def task_action(self, key: str, attempt: int, input: Any) -> StartTask:
        """The StartTask for an attempt already recorded as running (a delayed retry)."""
        node, path = parse_key(key)
        return self._task_action(node, path, key, attempt, input)

    def _task_action(self, node: int, path: Path, key: str, attempt: int, value: Any) -> StartTask:
        spec = self.nodes[node]
        return StartTask(
            key, attempt, node, spec.name or "", str(spec.kind), value, spec.params, path
        )

    def _where(self, node: int, key: str, message: str) -> str:
        spec = self.nodes[node]
        name = spec.name or str(spec.kind)
        return f"{spec.line}:{spec.column}: {name} ({key}): {message}"

    def _count_starts(self, state: State, node: int, count: int) -> None:
        limit = self.limits.task_starts
        assert limit is not None
        state.started += count
        if state.started > limit:
            spec = self.nodes[node]
            raise LimitExceeded(
                f"{spec.describe()}: the workflow has started {state.started:,} task "
                f"instances, more than the limit of {limit:,}",
                spec.line,
                spec.column,
            )

    def _first_attempt(self, state: State, node: int, key: str) -> int:
        """The attempt number of a new invocation: 1, or on a cycle one past the last used."""
        if node not in self.cyclic:
            return 1
        last = state.attempts.get(key, (0, 0))[1]
        state.attempts[key] = [last + 1, last + 1]
        return last + 1

    @staticmethod
    def _fail(state: State, failure: _Failure) -> list[Action]:
        # Nothing runs on for a failed workflow: late ends, retries and timeouts of the
        # tasks still out find no running attempt and change nothing.
        state.need_whole()
        state.status, state.error = FAILED, failure.reason
        state.stopped = dict(state.running)
        state.running.clear()
        return [Failed(failure.reason, failure.key)]


def _key_order(key: str) -> tuple[int, ...]:
    """Instance keys in graph order: by node, then by item path."""
    return tuple(int(part) for part in key.split("."))


def _kind_of(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if value is None:
        return "null"
    return f"{type(value).__name__} {value!r}"
