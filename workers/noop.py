"""Workers that do no real work: for tests, benchmarks and the demo.

:class:`NoopWorker` ends every task at once with its input as output;
:class:`SimulatedWorker` waits a random delay and fails a given share of tasks, its
outputs shaped for what follows in the flow (every flow runs to its end). Both serve
the kinds they are given, or every kind, following those that appear while they run.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Sequence
from time import monotonic
from typing import Any

import orjson
import redis

from flowlang.graph import Graph, NodeKind
from lifecycle.events import START_TASK, START_TASKS, end_task, end_task_template, is_start_tasks
from lifecycle.keys import DEFAULT_KIND, TASK_GROUP, Keys
from lifecycle.kind_limits import GaveUp, KindSlots
from lifecycle.priorities import stream_kind, stream_order, task_streams
from lifecycle.records import GRAPH
from rqse import EventListener
from rqse.deadletter import REJECTED
from rqse.errors import MalformedEntry
from rqse.weather import MOVED, classify
from workers.answers import AnswerPack, batch_pack
from workers.slots import BatchSlots
from workers.task import StoppedWorkflows, checked_pack, process_pack

__all__ = ["NoopWorker", "SimulatedWorker", "served_kinds"]

log = logging.getLogger(__name__)

BUILT_IN_KINDS = frozenset({"wait"})


def served_kinds(client: Any, keys: Keys, kinds: Iterable[str] | None = None) -> list[str]:
    """The kinds to serve: those given, else every known kind but the built-in ones."""
    if kinds:
        return sorted(set(kinds))
    known = {k.decode() for k in client.smembers(keys.kinds)}
    return sorted((known | {DEFAULT_KIND}) - BUILT_IN_KINDS)


_RAW = "raw"  # the event's key for the values copied, on the pass-through path
_START_TASK_JSON = orjson.dumps(START_TASK)  # an entry's raw kind field, for a start-task
_loads = orjson.loads
_dumps = orjson.dumps
_join = b"".join  # the entry's size: two joins cost less than two sums of lengths


class NoopWorker(EventListener):
    """Ends every start-task of ``kinds`` at once: output = input.

    ``kinds`` None serves every kind but the built-in ones, those that appear while
    it runs included: it follows ``{flow}:kinds`` (one SMEMBERS every
    ``discover_every`` seconds, from its own loop; a new kind's waiting tasks are
    served too). Their priority streams (lifecycle.priorities) are followed the same
    way, and read highest priority first.

    An engine start-task is answered without decoding it: the end-task's
    ``workflow``, ``key``, ``attempt``, ``token`` and ``output`` are the start-task's own JSON
    bytes (a benchmark measures the engine, not a worker's JSON round trip). Any
    other entry takes the ordinary path: decoded, and answered by ``end_task()``.

    ``pack_answers``: the copied answers of a batch go as one ``end-tasks`` entry
    (lifecycle.events.END_TASKS) instead of one end-task each.
    """

    def __init__(
        self,
        kinds: Iterable[str] | None = None,
        keys: Keys | None = None,
        home_pool: redis.ConnectionPool | None = None,
        *,
        pack_answers: bool = False,
        **options: Any,
    ) -> None:
        """``home_pool``: a pool on the Redis of the partitions' shared keys (the kinds'
        limits), when ``keys`` is one of several partitions; None: the listener's own."""
        self.keys = keys or Keys()
        self.pack_answers = pack_answers
        self._pack: AnswerPack | None = None  # the batch in hand's answers, when packed
        # The limits live on another node: looked up there (lifecycle.kind_limits).
        self._home = (
            redis.Redis(connection_pool=home_pool)
            if home_pool is not None and self.keys.home
            else None
        )
        if kinds is None:
            streams = [self.keys.tasks(DEFAULT_KIND)]
            options.setdefault("discover", self._every_kind)
            options.setdefault("discover_every", 2.0)
        else:
            streams = [self.keys.tasks(kind) for kind in kinds]
            served = list(kinds)
            options.setdefault("discover", lambda: self._streams_of(served))
            options.setdefault("discover_every", 2.0)
        options.setdefault("order", stream_order(self.keys))
        options.setdefault("batch_size", 200)
        options.setdefault("dead_letter_unselected", True)  # as TaskListener
        super().__init__(streams, TASK_GROUP, [START_TASK, START_TASKS], **options)
        self._end_task = end_task_template(self.keys.lifecycle, self.consumer)
        self._stopped = StoppedWorkflows(self.connection, self.keys, self.consumer)
        # Whether any kind has a limit, read with each batch: none costs nothing more.
        self.read_along = (self._stopped.along, ("EXISTS", self.keys.kind_limits))
        if self._home is not None:
            self.read_along = self.read_along[:1]
        self._slots: dict[str, BatchSlots] = {}  # by kind, for kinds found limited
        self._batch_slots: BatchSlots | None = None  # the batch in hand's, when limited
        self._kind_limited = False  # whether the batch's kind had a limit when it came
        self.flush_with_next_read = True  # one round trip per batch
        # The echo is this class's own: a subclass that computes its output or handles
        # tasks itself gets decoded events.
        cls = type(self)
        self._passes_through = (
            cls.output is NoopWorker.output
            and cls.answer is NoopWorker.answer
            and cls.process is NoopWorker.process
        )

    def _every_kind(self) -> list[str]:
        """The task streams of every known kind but the built-in ones, priority streams
        included."""
        return self._streams_of(served_kinds(self.connection, self.keys))

    def _streams_of(self, kinds: Iterable[str]) -> list[str]:
        """The streams of ``kinds``: each one's own and its priority streams."""
        return [found.stream for found in task_streams(self.connection, self.keys, kinds)]

    def prepare_batch(
        self, stream: str, entries: Sequence[tuple[bytes, dict[bytes, bytes]]]
    ) -> set[bytes] | None:
        """Start-tasks of attempts a workflow stopped are not answered (one HMGET, when
        any stop record exists); when the kind has a limit, the others take their slots
        (:class:`BatchSlots`, one call)."""
        self._pack = batch_pack(self._pack, self)
        replies = self.read_replies
        skipped = self._stopped(entries, replies[0] if replies else None)
        self._batch_slots = None
        self._kind_limited = False
        if self._home is not None:
            any_limit: Any = self._kind_slots(stream).slots.limited(None)
        elif len(self.read_along) < 2:  # not allowed to read the limits
            return skipped
        else:
            any_limit = replies[1] if replies and len(replies) > 1 else True  # claimed: look
        if isinstance(any_limit, BaseException):
            if classify(any_limit) not in (None, MOVED):  # (MOVED: the key lives elsewhere)
                raise any_limit  # for now: the batch waits it out, its limits read again
            self.read_along = self.read_along[:1]
            log.warning(
                "consumer %s: cannot read %s (%s); kinds run without their limits",
                self.consumer,
                self.keys.kind_limits,
                any_limit,
            )
            return skipped
        if not any_limit:
            return skipped
        slots = self._kind_slots(stream)
        singles = [
            i
            for i, f in entries
            if f and not (skipped and i in skipped) and not is_start_tasks(f.get(b"kind"))
        ]
        if slots.take(singles):
            self._batch_slots = slots
            self._kind_limited = True
        elif len(singles) < len(entries):  # packs: they go back one by one if it is limited
            self._kind_limited = slots.slots.limited(None)
        return skipped

    def _kind_slots(self, stream: str) -> BatchSlots:
        kind = stream_kind(self.keys, stream)
        slots = self._slots.get(kind)
        if slots is None:
            kind_slots = KindSlots(self.connection, self.keys, kind, self.consumer, home=self._home)
            slots = self._slots[kind] = BatchSlots(kind_slots)
        return slots

    def finish_batch(self, stream: str) -> None:
        """The batch's packed answers are emitted; the slots of its tasks go with them."""
        if self._pack is not None:
            self._pack.send_pack()
        slots, self._batch_slots = self._batch_slots, None
        if slots is not None:
            release = slots.finish()
            if release is not None:
                self.emit_command(*release)

    def decode_entry(self, fields: dict[bytes, bytes], event_id: str) -> dict[str, Any]:
        if not self._passes_through or fields.get(b"kind") != _START_TASK_JSON:
            return self._decoded(fields, event_id)
        try:
            # What is copied is checked as the ordinary path would check it (each value
            # JSON on its own, of the engine's types); what is not copied is not decoded.
            copied = (
                fields[b"workflow"],
                fields[b"key"],
                fields[b"attempt"],
                fields[b"token"],
                fields.get(b"input", b"null"),
            )
            workflow, key, attempt, token, output = copied
            if not (
                type(_loads(workflow)) is str
                and type(_loads(key)) is str
                and type(_loads(attempt)) is int
                and type(_loads(token)) is str
                and len(_join(fields.values())) + len(_join(fields)) <= self._max_entry_bytes
            ):
                return self._decoded(fields, event_id)
            if output == b"null":
                copied = (workflow, key, attempt, token, b"{}")  # as end_task(): {} for none
            else:
                _loads(output)
        except (KeyError, orjson.JSONDecodeError):
            return self._decoded(fields, event_id)
        return {"kind": START_TASK, _RAW: copied}

    def _decoded(self, fields: dict[bytes, bytes], event_id: str) -> dict[str, Any]:
        """The ordinary path; a start-task that names no workflow goes to the dead
        letters at once (no delivery would make it answerable)."""
        event = checked_pack(super().decode_entry(fields, event_id), event_id)
        if event.get("kind") == START_TASK and not isinstance(event.get("workflow"), str):
            raise MalformedEntry(
                REJECTED, "start-task without a string 'workflow'", event_id, "workflow"
            )
        return event

    def output(self, event: dict[str, Any]) -> Any:
        return event.get("input")

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        """Answer the task, once it holds a slot when its kind has a limit."""
        if event.get("kind") == START_TASKS:
            return self._process_pack(event_id, event)
        slots = self._batch_slots
        if slots is None:
            return self.answer(event)
        try:
            slot = slots.hold(event_id, self._stopping_reason)
        except GaveUp as gave_up:  # left pending, for another worker to take over
            raise InterruptedError(gave_up.reason) from None
        try:
            answered = self.answer(event)
        except BaseException:
            if slot is not None:
                slots.failed(slot)
            raise
        if slot is not None:
            slots.ran(slot)
        return answered

    def _process_pack(self, event_id: str, event: dict[str, Any]) -> bool:
        """Each task of a ``start-tasks`` pack answered as a lone start-task would be
        (:func:`workers.task.process_pack`)."""
        quick = self._pack if self._passes_through else None

        def answer(start: dict[str, Any]) -> bool:
            return (quick is not None and _quick_answer(quick, start)) or self.answer(start)

        limited, limited_now = self._kind_limited, self._limited_now
        process_pack(self, self._stopped, event_id, event, limited, limited_now, answer)
        return True

    def _limited_now(self) -> bool:
        """Whether the stream in hand's kind has a limit, asked now (not when the limits
        are not ours to read)."""
        stream = self.current_stream
        if stream is None or (self._home is None and len(self.read_along) < 2):
            return False
        slots = self._kind_slots(stream).slots
        return slots.limited(None) if slots.checking else False

    def _stopping_reason(self) -> str | None:
        return "stopping while it waited for a slot" if self.stopping else None

    def answer(self, event: dict[str, Any]) -> bool:
        """Send the task's answer (output = input): a hook for subclasses."""
        copied = event.get(_RAW)
        if copied is None:
            answer = end_task(event, self.output(event), worker=self.consumer)
            self.emit(answer, self.keys.lifecycle)
            return True
        if self._pack is not None and self._pack.add(*copied):
            return True
        self.emit_filled(self._end_task, *copied)
        return True


def _quick_answer(pack: AnswerPack, start: dict[str, Any]) -> bool:
    """Pack the answer (output = input) of a start-task of the engine's own shape in one
    JSON encoding; False, nothing packed, for any other (answered the ordinary way)."""
    key, attempt, token = start.get("key"), start.get("attempt"), start.get("token")
    if not (type(key) is str and type(attempt) is int and type(token) is str):
        return False
    output = start.get("input")
    answer = _dumps([start["workflow"], key, attempt, token, {} if output is None else output])
    return pack.add_answer(answer)


class SimulatedWorker(NoopWorker):
    """Waits up to ``delay_max`` seconds per task and fails ``failures`` percent of them."""

    #: As TaskListener.task_seconds: observes each simulated task's seconds when set.
    task_seconds: Any = None

    def __init__(
        self,
        kinds: Iterable[str] | None = None,
        keys: Keys | None = None,
        delay_max: float = 0.5,
        failures: float = 0.0,
        seed: int | None = None,
        **options: Any,
    ) -> None:
        options.setdefault("batch_size", 1)
        super().__init__(kinds, keys, **options)
        self.delay_max = delay_max
        self.failures = failures
        self.random = random.Random(seed)
        self._graphs: dict[bytes, Graph] = {}  # by content hash: a graph never changes

    def answer(self, event: dict[str, Any]) -> bool:
        if self.task_seconds is None:
            return self._simulate(event)
        started = monotonic()
        try:
            return self._simulate(event)
        finally:
            kind = (self.current_stream or "").rpartition(":tasks:")[2]
            self.task_seconds.labels(kind).observe(monotonic() - started)

    def _simulate(self, event: dict[str, Any]) -> bool:
        if self.delay_max > 0 and self.sleep(self.random.uniform(0, self.delay_max)):
            raise InterruptedError("stopping")  # left pending: another worker takes it
        if self.random.uniform(0, 100) < self.failures:
            failed = end_task(event, error="simulated failure", worker=self.consumer)
            self.emit(failed, self.keys.lifecycle)
        else:
            self.emit(
                end_task(event, self.output(event), worker=self.consumer), self.keys.lifecycle
            )
        return True

    def output(self, event: dict[str, Any]) -> Any:
        """Shaped as the flow's next steps need, so that every flow runs to its end.

        An object: itself, its ``done`` list extended by this task's name. Before a
        ``*`` (``A → * B``): a list — the input's own, else the first list the object
        holds, each object in it given the object's other fields (``{batch: 42,
        items: [{sku: a1}]}`` → ``[{batch: 42, sku: a1}]``), else ``[input]``. Right
        after a fan-out's join (``{ A  B } → C``): one object with the fields of every
        object the branches gave, later ones winning, as a summarizing step would
        give. Anything else (an iteration's list of results included): the input.
        The graph is read to know: one HGET per task, the graph once per flow.
        """
        value = event.get("input")
        graph = self._graph(event)
        node = event.get("index")
        if graph is not None and type(node) is int and 0 <= node < len(graph.nodes):
            if _iterates_next(graph, node):
                return _items(value)
            if isinstance(value, list) and _joins_branches(graph, node):
                value = _merged(value)
        if isinstance(value, dict):
            done = value.get("done")
            return {**value, "done": [*(done if isinstance(done, list) else ()), event.get("name")]}
        return value

    def _graph(self, event: dict[str, Any]) -> Graph | None:
        """The graph of the event's workflow (None when unknown or unreadable)."""
        workflow = event.get("workflow")
        if not isinstance(workflow, str):
            return None
        digest = self.connection.hget(self.keys.workflow(workflow), GRAPH)
        if not isinstance(digest, bytes):
            return None
        graph = self._graphs.get(digest)
        if graph is None:
            raw = self.connection.get(self.keys.graph(digest.decode()))
            if raw is None:
                return None
            try:
                graph = Graph.from_json(raw)
            except (ValueError, KeyError, TypeError) as error:
                log.debug("workflow %s: graph %s unreadable: %s", workflow, digest, error)
                return None
            if len(self._graphs) >= 64:
                self._graphs.clear()
            self._graphs[digest] = graph
        return graph


def _iterates_next(graph: Graph, node: int) -> bool:
    """Whether a successor of ``node`` iterates, looking through fan-outs (``{ * B  C }``)."""
    seen: set[int] = set()
    frontier = list(graph.successors(node))
    while frontier:
        target = frontier.pop()
        if target in seen:
            continue
        seen.add(target)
        found = graph.nodes[target]
        if found.iterate:
            return True
        if found.kind == NodeKind.SUBFLOW_START:
            frontier.extend(graph.successors(target))
    return False


def _joins_branches(graph: Graph, node: int) -> bool:
    """Whether ``node`` comes right after the join of a fan-out (not of an iteration)."""
    for source in graph.predecessors(node):
        pair = graph.nodes[source].pair
        if graph.nodes[source].kind == NodeKind.SUBFLOW_END and pair is not None:
            return not graph.nodes[pair].iterate
    return False


def _items(value: Any) -> list[Any]:
    """What a ``*`` after this task iterates over (:meth:`SimulatedWorker.output`)."""
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        for name, items in value.items():
            if name != "done" and isinstance(items, list):
                shared = {k: v for k, v in value.items() if k not in (name, "done")}
                return [{**shared, **item} if isinstance(item, dict) else item for item in items]
    return [value]


def _merged(values: list[Any]) -> Any:
    """The fields of every object in ``values`` (nested lists included), later ones
    winning; ``values`` itself when it holds no object."""
    merged: dict[str, Any] | None = None
    stack = list(reversed(values))
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            merged = {**(merged or {}), **value}
        elif isinstance(value, list):
            stack.extend(reversed(value))
    return values if merged is None else merged
