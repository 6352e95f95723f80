"""The task contract: ``TaskListener``, a worker for one task kind, and the ``Task`` it runs.

Subclass :class:`TaskListener`, set ``kind`` and override :meth:`TaskListener.run`::

    class Upper(TaskListener):
        kind = "text"                      # serves tasks named text:..., stream {flow}:tasks:text

        def run(self, task: Task) -> Any:
            return {"text": task.input["text"].upper()}

    Upper().listen()                       # or: python -m workers run mymodule:Upper

The return value becomes a SUCCESS ``end-task`` with that output; an exception
becomes a FAILURE with ``"<ExceptionType>: <message>"`` as its error (the
lifecycle applies ``$retries``), logged at INFO in one line (the traceback at
DEBUG: a failing task is the task's business, not the worker's). An output
beyond :class:`flowlang.limits.Limits` (``value_bytes``, ``depth``) or not JSON
fails the task with that reason instead of reaching Redis. Every answer echoes
the start-task's attempt ``token``, without which the lifecycle refuses it.

The end-task is written in the same transaction as the acknowledgement of the
start-task, so a worker killed in between runs the task again on redelivery:
``run`` must tolerate repeats (``task.id`` is the idempotency key of the attempt).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from time import monotonic
from typing import Any, ClassVar

import orjson
import redis

from flowlang.limits import DEFAULT_LIMITS, LimitExceeded, Limits, encode_value
from lifecycle.errors import BadEvent
from lifecycle.events import (
    START_TASK,
    START_TASKS,
    end_task,
    is_start_task,
    is_start_tasks,
    parse_start_tasks,
    sent_again,
)
from lifecycle.keys import TASK_GROUP, Keys
from lifecycle.kind_limits import DEFAULT_CHECK_INTERVAL, DEFAULT_LEASE, GaveUp, KindSlots
from lifecycle.priorities import kind_streams, stream_order
from rqse import EventListener, mask_url
from rqse.deadletter import REJECTED
from rqse.errors import MalformedEntry
from rqse.events import encode_event
from rqse.fastpipe import execute
from workers.answers import AnswerPack, batch_pack
from workers.errors import BadTask
from workers.scripts import load_script
from workers.slots import BatchSlots

__all__ = ["HandBack", "StoppedWorkflows", "Task", "TaskListener", "encode_output", "error_text"]

log = logging.getLogger(__name__)
_loads = orjson.loads

_ENDED = frozenset({"finished", "failed", "terminated", "missing", "replaced"})
# Seconds between two looks for a kind's new priority streams (one round trip each).
PRIORITY_DISCOVERY = 2.0
# An error text is the task's, sent as is, but a task's exception can carry
# anything (a whole response body): past this it is cut, so no answer is huge.
ERROR_CHARS = 4096


def error_text(error: BaseException) -> str:
    """``"<ExceptionType>: <message>"``, cut to :data:`ERROR_CHARS` characters."""
    text = f"{type(error).__name__}: {error}"
    if len(text) > ERROR_CHARS:
        text = f"{text[:ERROR_CHARS]}... ({len(text):,} characters, cut)"
    return text


def encode_output(output: Any, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """``output`` as the JSON bytes an end-task carries; :class:`LimitExceeded` when it is
    not JSON or breaks ``limits`` (size, depth)."""
    return encode_value(output, limits, "output")


class HandBack(Exception):  # noqa: N818 - a signal to the listener, not an error
    """Raise from ``run`` to give the task back unanswered. While the listener is stopping
    (its use: shutdowns) the same start-task goes back on its stream, atomically with
    this delivery's acknowledgement, for any worker to take, and never counts towards
    ``max_deliveries``; otherwise it stays pending and is retried after ``claim_idle``.
    A task of a ``start-tasks`` pack goes back on its stream at once either way, as a
    start-task of its own (the pack's other tasks run on)."""


class _CancelCheck:
    """Asks Redis at most once per ``interval`` whether the attempt is still wanted."""

    def __init__(self, script: Any, key: str, node: str, attempt: int | None, interval: float):
        self._script = script
        self._args = [node, "" if attempt is None else str(attempt)]
        self._key = key
        self._interval = interval
        self._checked = float("-inf")
        self._lock = threading.Lock()
        self.state = "running"

    def __call__(self) -> bool:
        with self._lock:
            if self.state not in _ENDED and monotonic() - self._checked >= self._interval:
                self._checked = monotonic()
                raw = self._script(keys=[self._key], args=self._args)
                self.state = raw.decode() if isinstance(raw, bytes) else str(raw)
            return self.state in _ENDED


@dataclass(frozen=True, slots=True)
class Task:
    """One task attempt, as a worker sees it.

    ``key`` is the node instance (``"3"``, or ``"3.0.2"`` inside iterations);
    ``id`` (``<workflow>/<key>/<attempt>``) names the attempt and is what
    idempotent side effects should be keyed on. ``parameters`` never contains the
    reserved ``$`` names. ``event_id`` is the stream entry's (shared by the tasks of
    a ``start-tasks`` pack).
    """

    workflow: str
    name: str
    index: int | None
    key: str
    attempt: int | None
    id: str
    input: Any
    parameters: Mapping[str, Any]
    event_id: str = ""
    _cancel: Any = field(default=None, repr=False, compare=False)

    @property
    def kind(self) -> str:
        """The name's prefix before ``:`` (``wait`` for ``wait:delay``), else ``default``."""
        prefix, colon, _ = self.name.partition(":")
        return prefix if colon else "default"

    @property
    def operation(self) -> str:
        """The name after the kind prefix (``delay`` for ``wait:delay``)."""
        return self.name.partition(":")[2] or self.name

    def cancelled(self) -> bool:
        """True once the workflow has ended (terminated, failed, finished) or this attempt
        is no longer its running one (timed out). Cheap: at most one small Redis call
        per ``cancel_check_interval`` seconds, and sticky once True."""
        return bool(self._cancel()) if self._cancel is not None else False

    @classmethod
    def from_event(cls, event_id: str, event: Mapping[str, Any], cancel: Any = None) -> Task:
        """The task of a start-task event; raises BadTask without workflow or name."""
        workflow, name = event.get("workflow"), event.get("name")
        if not isinstance(workflow, str) or not isinstance(name, str):
            raise BadTask(
                f"start-task {event_id}: needs string 'workflow' and 'name', "
                f"got {workflow!r} and {name!r}"
            )
        index = event.get("index")
        key = str(event.get("key", index))
        attempt = event.get("attempt")
        parameters = event.get("parameters") or {}
        return cls(
            workflow=workflow,
            name=name,
            index=index if isinstance(index, int) else None,
            key=key,
            attempt=attempt if isinstance(attempt, int) else None,
            id=str(event.get("id") or f"{workflow}/{key}/{attempt or 1}"),
            input=event.get("input"),
            parameters=parameters if isinstance(parameters, Mapping) else {},
            event_id=event_id,
            _cancel=cancel,
        )


class StoppedWorkflows:
    """Sets aside the start-tasks of a batch whose attempt a failed or terminated
    workflow stopped (``Keys.stopped``: workflow id -> the attempts it stopped, key ->
    attempt; ``{}`` stops every one): one HMGET per batch, for the listener's
    ``prepare_batch``. Nobody takes their answers, so they are acknowledged without
    running and without an answer, one INFO line each. A restart's next attempts are
    past the stopped ones: they run.

    The HMGET only when the hash exists: :attr:`along` (``EXISTS``) goes with each read
    of new entries (the listener's ``read_along``), and its reply, passed as
    ``exists``, says whether there is any stop record to look up (most of the time,
    none: no round trip then).

    The check saves work, it does not make anything correct (the lifecycle refuses
    late answers anyway): when Redis refuses it, the batch runs as it would without.
    A user not allowed HMGET on the hash is said once, then never asked again.
    """

    def __init__(self, client: redis.Redis, keys: Keys, consumer: str) -> None:
        self._client = client
        self._key = keys.stopped
        self._consumer = consumer
        self._checking = True
        #: For the listener's ``read_along``: whether any stop record exists.
        self.along = ("EXISTS", self._key)

    def __call__(
        self, entries: Sequence[tuple[bytes, Mapping[bytes, bytes]]], exists: Any = None
    ) -> set[bytes] | None:
        """The ids of ``entries`` (raw, as read) not to run; None when there are none.
        ``exists``: the reply to :attr:`along` sent with the read of ``entries`` (0: no
        stop record, nothing to look up), None when it was not sent."""
        if not self._checking or exists == 0:
            return None
        starts: list[tuple[bytes, bytes, Mapping[bytes, bytes]]] = []
        for entry_id, fields in entries:
            if not fields or not is_start_task(fields.get(b"kind")):
                continue
            raw = fields.get(b"workflow") or b"null"
            name = raw[1:-1]
            if raw[:1] == b'"' and raw[-1:] == b'"' and b'"' not in name and b"\\" not in name:
                # A JSON string without escapes is its UTF-8 between the quotes (should
                # it not be JSON after all, _stopped() says so: the decoding path
                # dead-letters it).
                starts.append((entry_id, name, fields))
                continue
            try:
                workflow = _loads(raw)
            except orjson.JSONDecodeError:
                continue  # the decoding path dead-letters it
            if isinstance(workflow, str):
                starts.append((entry_id, workflow.encode(), fields))
        if not starts:
            return None
        stops = self._records(list(dict.fromkeys(workflow for _, workflow, _ in starts)))
        if not stops:
            return None
        skipped = set()
        for entry_id, workflow, fields in starts:
            record = stops.get(workflow)
            if record is not None and _stopped(record, workflow, fields):
                log.info(
                    "task %s not started: workflow %s stopped it",
                    _task_id(fields),
                    workflow.decode(errors="replace"),
                )
                skipped.add(entry_id)
        return skipped

    def covered(self, starts: Sequence[Mapping[str, Any]], exists: Any = None) -> set[int]:
        """Which of ``starts`` (the decoded start-tasks of a ``start-tasks`` pack) a stop
        record covers, by index, one INFO line each; ``exists`` as for a call."""
        if not self._checking or exists == 0:
            return set()
        names = {start["workflow"].encode() for start in starts}
        stops = self._records(list(names))
        if not stops:
            return set()
        covered = set()
        for n, start in enumerate(starts):
            record = stops.get(start["workflow"].encode())
            if record is not None and _covers(record, start.get("key"), start.get("attempt")):
                log.info(
                    "task %s not started: workflow %s stopped it",
                    start.get("id"),
                    start["workflow"],
                )
                covered.add(n)
        return covered

    def _records(self, workflows: list[bytes]) -> dict[bytes, bytes] | None:
        """The stop records of those of ``workflows`` that have one (None: not checked)."""
        try:
            (records,) = execute(self._client, [("HMGET", self._key, *workflows)])
            if isinstance(records, BaseException):
                raise records
        except redis.exceptions.NoPermissionError as error:
            self._checking = False
            log.warning(
                "consumer %s: cannot check %s (%s); tasks of ended workflows will run",
                self._consumer,
                self._key,
                error,
            )
            return None
        except redis.RedisError as error:
            log.debug("consumer %s: %s not checked: %s", self._consumer, self._key, error)
            return None
        return {
            workflow: record
            for workflow, record in zip(workflows, records, strict=True)
            if record is not None
        }


def _stopped(record: bytes, workflow: bytes, fields: Mapping[bytes, bytes]) -> bool:
    """Whether a stop record (``{key: attempt}``, ``{}`` = all) of ``workflow`` covers this
    start-task (which must name it in proper JSON)."""
    try:
        if _loads(fields.get(b"workflow") or b"null") != workflow.decode():
            return False
        key, attempt = _loads(fields.get(b"key") or b"null"), _loads(fields.get(b"attempt") or b"0")
    except (orjson.JSONDecodeError, UnicodeDecodeError):
        return False  # not ours to judge: it runs, the lifecycle decides on its answer
    return _covers(record, key, attempt)


def _covers(record: bytes, key: Any, attempt: Any) -> bool:
    """Whether a stop record (``{key: attempt}``, ``{}`` = all) covers attempt ``attempt``
    of node instance ``key``."""
    try:
        stopped = _loads(record)
    except orjson.JSONDecodeError:
        return False  # not ours to judge: it runs, the lifecycle decides on its answer
    if not stopped:
        return True
    last = stopped.get(key) if isinstance(stopped, dict) else None
    return isinstance(last, int) and isinstance(attempt, int) and attempt <= last


# Seconds of a pack's running between two looks at its workflows' stop records and its
# kind's limit: a terminate or a new limit reaches the pack's tasks not yet run, as it
# reaches lone start-tasks read after it, at one or two round trips a second at most.
RECHECK_EVERY = 0.25


def process_pack(
    listener: EventListener,
    stopped: StoppedWorkflows,
    event_id: str,
    event: Mapping[str, Any],
    limited: bool,
    limited_now: Callable[[], bool],
    answer: Callable[[dict[str, Any]], bool],
) -> None:
    """Handle a ``start-tasks`` pack: answer its tasks in turn (:func:`run_pack`), but
    for its malformed ones (one WARNING line each: only a lifecycle worker writes packs)
    and those a stop record covers (:meth:`StoppedWorkflows.covered`, looked at again
    while the pack runs); while the kind has a limit (``limited`` as the batch came,
    ``limited_now()`` asked while the pack runs), answer none: each goes back on the
    stream as a start-task of its own, to take its own slot. :class:`MalformedEntry`
    when ``tasks`` is not a list."""
    try:
        starts, bad = parse_start_tasks(event_id, dict(event))
    except BadEvent as error:
        raise MalformedEntry(REJECTED, str(error), event_id, "tasks") from None
    for reason in bad:
        log.warning("consumer %s: %s; left out", listener.consumer, reason)
    replies = listener.read_replies
    exists = replies[0] if replies else None

    def runnable(
        rest: list[dict[str, Any]], exists: Any = None, limited: bool | None = None
    ) -> list[dict[str, Any]] | None:
        """Those of ``rest`` to run; None while the kind has a limit (all go back)."""
        try:
            if limited_now() if limited is None else limited:
                return None
            covered = stopped.covered(rest, exists) if rest else ()
        except redis.RedisError:  # a look that saves work: without it, they run
            return rest
        return [start for n, start in enumerate(rest) if n not in covered] if covered else rest

    first = runnable(starts, exists, limited)
    if first is None:
        hand_back(listener, starts)
    else:
        run_pack(listener, first, answer, runnable)


def run_pack(
    listener: EventListener,
    starts: list[dict[str, Any]],
    answer: Callable[[dict[str, Any]], bool],
    runnable: Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None] | None = None,
) -> None:
    """Answer each of ``starts`` (a pack's start-tasks) with ``answer`` in turn: False
    from it says the task went back on the stream (stopping). Every
    :data:`RECHECK_EVERY` seconds, ``runnable(rest)`` says which of the rest still run
    (None: none). Those not answered go back on the stream one start-task each, with the
    pack's acknowledgement: a task raising :class:`HandBack`, alone (it waits its turn
    again); on a stop, or a failure of the worker itself (Redis gone from under a task),
    the rest: each then has its own deliveries, and none of them waits on, or runs
    again with, the others."""
    checked = monotonic()
    n = 0
    while n < len(starts):
        if listener.stopping:
            hand_back(listener, starts[n:])
            return
        if runnable is not None and monotonic() - checked >= RECHECK_EVERY:
            rest = runnable(starts[n:])
            checked = monotonic()
            if rest is None:
                hand_back(listener, starts[n:])
                return
            starts = starts[:n] + rest
            if n == len(starts):
                return
        start = starts[n]
        n += 1
        try:
            answered = answer(start)
        except HandBack:
            hand_back(listener, [start])
            continue
        except Exception as error:
            if not listener.stopping:
                log.warning(
                    "consumer %s: task %s of a pack: %s; it and the %d after it go back on "
                    "the stream one by one",
                    listener.consumer,
                    start.get("id"),
                    error_text(error),
                    len(starts) - n,
                )
            hand_back(listener, starts[n - 1 :])
            return
        if not answered:
            hand_back(listener, starts[n:])
            return


def hand_back(listener: EventListener, starts: Sequence[dict[str, Any]]) -> None:
    """Put ``starts`` (decoded start-tasks) back on the listener's stream in hand, one
    entry each (marked sent again), with the batch's acknowledgement."""
    for start in starts:
        listener.emit(sent_again(start), listener.current_stream)


def checked_pack(event: dict[str, Any], event_id: str) -> dict[str, Any]:
    """A decoded entry as read; :class:`MalformedEntry` (dead-lettered at once, no delivery
    would mend it) for a ``start-tasks`` pack whose ``tasks`` is not a list."""
    if event.get("kind") == START_TASKS and type(event.get("tasks")) is not list:
        raise MalformedEntry(
            REJECTED,
            f"start-tasks: field 'tasks' is {repr(event.get('tasks'))[:120]}, expected list",
            event_id,
            "tasks",
        )
    return event


def _task_id(fields: Mapping[bytes, bytes]) -> str:
    """A start-task's ``id`` (``<workflow>/<key>/<attempt>``), from its raw fields."""
    try:
        value = _loads(fields.get(b"id") or b"null")
        if isinstance(value, str):
            return value
        parts = [_loads(fields.get(name) or b"null") for name in (b"workflow", b"key", b"attempt")]
    except orjson.JSONDecodeError:
        return "?"
    return "/".join(map(str, parts))


class TaskListener(EventListener):
    """An :class:`rqse.EventListener` bound to one task kind: ``{flow}:tasks:<kind>``,
    group ``workers`` (shared by every worker of the kind, so each task goes to one).

    ``kind`` comes from the argument or the class attribute. Other keyword options
    are the listener's (``consumer``, ``pool``/``url``, ``claim_idle``, ...);
    ``batch_size`` defaults to 1 here, so a slow task never holds others back —
    raise it for fast tasks, and use several instances (``--concurrency``) for
    parallel ones. The kind's priority streams (lifecycle.priorities) are read with it,
    up to ``batch_size`` from each per read, the highest priority run first. While
    ``run`` works, rqse's lease keeps the start-task from being claimed by another
    worker, however long it takes; if the process dies the lease lapses and a peer
    takes the task over after ``claim_idle``.

    A kind with a concurrency limit (``python -m lifecycle limit set KIND N``,
    :mod:`lifecycle.kind_limits`) runs a task only once it holds one of the N
    slots: it waits in line first, and ``slot_lease`` is how long a slot outlives
    a worker that died holding it.

    A ``start-tasks`` pack (lifecycle ``--pack-starts``) is run task by task, each as
    a lone start-task; the tasks not run (a stop, a :class:`HandBack`, a limited kind)
    go back on the stream one start-task each, with the pack's acknowledgement.
    """

    kind: ClassVar[str | None] = None
    cancel_check_interval: ClassVar[float] = 1.0
    #: What an output may be: larger or deeper fails the task (set on a subclass or instance).
    limits: Limits = DEFAULT_LIMITS
    #: Observes each run()'s seconds when set (``--metrics-port``: a prometheus_client
    #: Histogram with a ``kind`` label, workers.metrics); None costs nothing.
    task_seconds: Any = None
    #: Send the successful answers of a batch as one ``end-tasks`` entry (workers.answers):
    #: for fast tasks read ``batch_size`` > 1 at a time, once every lifecycle worker of the
    #: deployment reads such entries (docs/operations.md). ``--pack-answers`` sets it.
    pack_answers: bool = False
    #: Seconds a slot of a limited kind outlives its holder's last renewal.
    slot_lease: float = DEFAULT_LEASE
    #: Longest a task waiting for a slot blocks before it looks whether it was cancelled.
    slot_check_interval: float = DEFAULT_CHECK_INTERVAL

    def __init__(
        self,
        kind: str | None = None,
        keys: Keys | None = None,
        home_pool: redis.ConnectionPool | None = None,
        **options: Any,
    ):
        """``home_pool``: a pool on the Redis of the partitions' shared keys (the kinds'
        limits), when ``keys`` is one of several partitions (``python -m workers`` passes
        it); None: the listener's own."""
        kind = kind or type(self).kind
        if not kind or not isinstance(kind, str):
            raise ValueError(
                f"{type(self).__name__}: no task kind (set the class attribute kind, "
                "pass kind=, or run it with --kind)"
            )
        self.kind = kind  # type: ignore[misc]  # the instance's own, from the argument
        self.keys = keys or Keys()
        options.setdefault("batch_size", 1)
        # Every priority stream of the kind too, in one read, highest first.
        options.setdefault("order", stream_order(self.keys))
        options.setdefault("discover", self._kind_streams)
        options.setdefault("discover_every", PRIORITY_DISCOVERY)
        # Only start-tasks (and rqse receipts) belong on a task stream: another kind
        # (garbage, or a newer lifecycle's) is dead-lettered, kept to be requeued.
        options.setdefault("dead_letter_unselected", True)
        super().__init__(self.keys.tasks(kind), TASK_GROUP, [START_TASK, START_TASKS], **options)
        self._attempt_state = load_script(self.connection, "attempt_state")
        self._stopped = StoppedWorkflows(self.connection, self.keys, self.consumer)
        self._slots = KindSlots(
            self.connection,
            self.keys,
            kind,
            self.consumer,
            lease=self.slot_lease,
            check_interval=self.slot_check_interval,
            home=None if home_pool is None else redis.Redis(connection_pool=home_pool),
        )
        self.read_along = (
            (self._stopped.along,)
            if self._slots.apart
            else (self._stopped.along, self._slots.along)
        )
        self._limit_reply = 1  # where the kind's limit is among read_replies
        self._batch_slots = BatchSlots(self._slots)
        self._limited = False  # whether the batch in hand took slots
        self._kind_limited = False  # whether the kind had a limit when the batch came
        self.flush_with_next_read = True  # one round trip per batch
        self._pack: AnswerPack | None = None  # made at the first batch, when packing

    def _kind_streams(self) -> list[str]:
        """The kind's streams: priority 0's and those ``{flow}:priorities`` names."""
        return kind_streams(self.connection, self.keys, str(self.kind))

    def prepare_batch(
        self, stream: str, entries: Sequence[tuple[bytes, dict[bytes, bytes]]]
    ) -> set[bytes] | None:
        """Start-tasks of workflows that have ended are not run (:class:`StoppedWorkflows`);
        when the kind has a limit, the others take their slots (:class:`BatchSlots`)."""
        self._pack = batch_pack(self._pack, self)
        replies, at = self.read_replies, self._limit_reply
        skipped = self._stopped(entries, replies[0] if replies else None)
        self._limited = self._kind_limited = False
        if not self._slots.limited(replies[at] if replies and len(replies) > at else None):
            if not self._slots.checking and len(self.read_along) > at:
                self.read_along = self.read_along[:at]  # refused: not sent any more
            return skipped
        self._kind_limited = True  # packs go back one task per entry, each to take a slot
        self._limited = self._batch_slots.take(
            [
                i
                for i, fields in entries
                if fields
                and not (skipped and i in skipped)
                and not is_start_tasks(fields.get(b"kind"))
            ]
        )
        return skipped

    def finish_batch(self, stream: str) -> None:
        """The batch's packed answers are sent; the slots of its tasks that ran go with
        them."""
        if self._pack is not None:
            self._pack.send_pack()
        if self._limited:
            self._limited = False
            release = self._batch_slots.finish()
            if release is not None:
                self.emit_command(*release)

    def run(self, task: Task) -> Any:
        """Do the task; return its output (None means ``{}``). Raise to fail it."""
        raise NotImplementedError(f"{type(self).__name__}.run() is not implemented")

    def task(self, event_id: str, event: Mapping[str, Any]) -> Task:
        """The Task of a start-task event, with its cancellation check."""
        workflow = event.get("workflow")
        key = str(event.get("key", event.get("index")))
        attempt = event.get("attempt")
        cancel = _CancelCheck(
            self._attempt_state,
            self.keys.workflow(str(workflow)),
            key,
            attempt if isinstance(attempt, int) else None,
            self.cancel_check_interval,
        )
        return Task.from_event(event_id, event, cancel)

    def decode_entry(self, fields: dict[bytes, bytes], event_id: str) -> dict[str, Any]:
        return checked_pack(super().decode_entry(fields, event_id), event_id)

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        if event.get("kind") == START_TASKS:
            return self._process_pack(event_id, event)
        task = self.task(event_id, event)
        if not self._limited:
            return self._answer(task, event)
        try:
            slot = self._batch_slots.hold(event_id, lambda: self._give_up(task))
        except GaveUp as gave_up:
            if gave_up.reason == "stopping":  # back on the stream, its place for another
                self.emit(sent_again(event), self.current_stream)
                return False
            log.info("task %s not started: %s while it waited for a slot", task.id, gave_up)
            return True
        if slot is None:  # the limit went meanwhile
            return self._answer(task, event)
        return self._answer_holding(task, event, slot)

    def _process_pack(self, event_id: str, event: dict[str, Any]) -> bool:
        """Each task of a ``start-tasks`` pack answered as a lone start-task would be
        (:func:`process_pack`)."""

        def answer(start: dict[str, Any]) -> bool:
            return self._answer(self.task(event_id, start), start)

        limited, limited_now = self._kind_limited, self._limited_now
        process_pack(self, self._stopped, event_id, event, limited, limited_now, answer)
        return True

    def _limited_now(self) -> bool:
        """Whether the kind has a limit, asked now."""
        return self._slots.limited(None) if self._slots.checking else False

    def _give_up(self, task: Task) -> str | None:
        """Why a task waiting for a slot should not wait on, if it should not."""
        if self.stopping:
            return "stopping"
        if task.cancelled():
            return f"its workflow {task.workflow} ended or the attempt was replaced"
        return None

    def _answer_holding(self, task: Task, event: dict[str, Any], slot: str) -> bool:
        """:meth:`_answer` while holding ``slot``, released with the batch's answers."""
        try:
            handled = self._answer(task, event)
        except BaseException:  # the entry stays pending: its slot goes now
            self._batch_slots.failed(slot)
            raise
        self._batch_slots.ran(slot)
        return handled

    def _answer(self, task: Task, event: dict[str, Any]) -> bool:
        try:
            output = self.run(task) if self.task_seconds is None else self._timed(task)
        except HandBack:
            log.info("task %s: handed back by %s", task.id, self.consumer)
            if not self.stopping:
                raise
            # Re-queued rather than left pending: redeliveries of a pending entry count
            # towards max_deliveries, and a task handed back at every shutdown would end
            # in the dead letters.
            self.emit(sent_again(event), self.current_stream)
            return False
        except redis.ConnectionError:
            raise  # Redis went away, not the task: leave it pending, retried later
        except Exception as error:
            # Expected: tasks fail. One line at INFO; the traceback only for debugging.
            log.info("task %s: %s failed: %s", task.id, _shown(task.name), error_text(error))
            log.debug("task %s: traceback", task.id, exc_info=True)
            self.fail(event, error_text(error))
            return True
        try:  # the encoding is the size check, and these bytes are what is sent
            encoded = encode_output({} if output is None else output, self.limits)
        except LimitExceeded as error:
            log.info("task %s: %s failed: %s", task.id, _shown(task.name), error)
            self.fail(event, str(error))
            return True
        answer = end_task(event, worker=self.consumer)
        if self._pack is not None and self._packed(answer, encoded):
            return True
        del answer["output"]
        fields = encode_event(answer)
        fields["output"] = encoded
        self.emit_fields(fields, self.keys.lifecycle)
        return True

    def _packed(self, answer: dict[str, Any], output: bytes) -> bool:
        """Whether ``answer`` went into the batch's pack: one of the engine's own shape
        (a start-task without a token, from before tokens, is answered alone)."""
        workflow, key, attempt, token = (
            answer.get(n) for n in ("workflow", "key", "attempt", "token")
        )
        if not (
            type(workflow) is str
            and type(key) is str
            and type(attempt) is int
            and type(token) is str
        ):
            return False
        assert self._pack is not None
        return self._pack.add(
            orjson.dumps(workflow), orjson.dumps(key), b"%d" % attempt, orjson.dumps(token), output
        )

    def _timed(self, task: Task) -> Any:
        """``run(task)``, its seconds observed by ``task_seconds`` (failures too)."""
        started = monotonic()
        try:
            return self.run(task)
        finally:
            self.task_seconds.labels(self.kind).observe(monotonic() - started)

    def fail(self, event: Mapping[str, Any], error: str) -> None:
        """Answer the start-task ``event`` with a FAILURE carrying ``error``."""
        self.emit(end_task(dict(event), error=error, worker=self.consumer), self.keys.lifecycle)


def _shown(name: str) -> str:
    """A task's name as a log shows it: a resource's URI without its password."""
    return mask_url(name) if "://" in name else name
