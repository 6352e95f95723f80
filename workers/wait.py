"""The built-in ``wait:`` kind: delays, event waits and countdown latches, durable in Redis.

:class:`WaitWorker` runs three loops that share nothing but Redis:

* :class:`WaitTaskListener` reads ``{flow}:tasks:wait`` (group ``workers``) and
  takes each start-task with ``wait_register.lua``: the acknowledgement and the
  registration (or the immediate end-task) are one atomic step;
* :func:`delay_pump` polls ``{flow}:wait:delays`` and ends due delays with
  ``fire_delays.lua``, each once however many pumps run;
* :class:`~workers.wait_events.EventWatcher` reads ``{flow}:lifecycle``
  (group ``wait``) and ends matching event waits.

No wait lives in a sleeping thread: stop or kill a WaitWorker at any point and
another (or the same, restarted) carries on where it left off. The crash
windows are written down in ``docs/workers.md``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import orjson
import redis

from flowlang.limits import LimitExceeded
from lifecycle.events import START_TASK, end_task
from lifecycle.keys import TASK_GROUP, WAIT_KIND, Keys
from lifecycle.priorities import kind_streams, stream_order
from rqse import EventListener
from rqse.errors import EventEncodingError
from rqse.events import encode_event
from rqse.listener import default_consumer_name
from rqse.pump import Pump
from rqse.weather import is_weather
from workers.errors import BadTask, WaitParameterError, WorkerError
from workers.scripts import load_script
from workers.task import PRIORITY_DISCOVERY, Task, encode_output, error_text
from workers.wait_events import EventWatcher, catch_up, entry_order
from workers.waitspec import Delay, EventWait, Latch, wait_spec

__all__ = ["WaitTaskListener", "WaitWorker", "delay_pump"]

log = logging.getLogger(__name__)

# Fields the scripts add when the wait ends; everything else is fixed at registration.
_OUTCOME = ("status", "output", "error")


def wait_record(event: dict[str, Any], worker: str, output: bytes | None = None) -> bytes:
    """The record a registered wait keeps: the end-task fields, encoded (the attempt's
    ``token`` among them, so the answer fired later is accepted), minus the outcome;
    and the output on success (``output``, default: the task's input, encoded)."""
    answer = end_task(event, worker=worker)
    fields = encode_event({k: v for k, v in answer.items() if k not in _OUTCOME})
    flat: list[str] = []
    for name, value in fields.items():
        flat += (name, value.decode())
    if output is None:
        output = _encode_input(event.get("input"))
    return orjson.dumps({"fields": flat, "output": output.decode()})


def _encode_input(value: Any) -> bytes:
    """The task's input as the output of a wait that succeeds; WaitParameterError when
    it cannot be sent on (an integer beyond 64 bits, a value past the limits)."""
    try:
        return encode_output({} if value is None else value)
    except LimitExceeded as error:
        raise WaitParameterError(f"the input cannot be the wait's output: {error}") from None


class WaitTaskListener(EventListener):
    """Takes ``wait:`` start-tasks: registers their waits (or ends them) atomically with
    their acknowledgement, a whole batch in one pipeline."""

    def __init__(self, keys: Keys | None = None, **options: Any) -> None:
        self.keys = keys or Keys()
        options.setdefault("batch_size", 200)
        options.setdefault("claim_idle", 10.0)
        options.setdefault("order", stream_order(self.keys))
        options.setdefault("discover", self._kind_streams)
        options.setdefault("discover_every", PRIORITY_DISCOVERY)
        options.setdefault("dead_letter_unselected", True)  # as TaskListener
        super().__init__(self.keys.tasks(WAIT_KIND), TASK_GROUP, [START_TASK], **options)
        self._register = load_script(self.connection, "wait_register")
        self._complete = load_script(self.connection, "wait_complete")
        self.outcomes = {0: 0, 1: 0, 2: 0, 3: 0}  # taken already / ended / waiting / failed

    def _kind_streams(self) -> list[str]:
        """The wait kind's streams: priority 0's and those ``{flow}:priorities`` names."""
        return kind_streams(self.connection, self.keys, WAIT_KIND)

    def process_batch(self, batch: list[tuple[str, dict[str, Any]]]) -> list[str]:
        pipe = self.connection.pipeline(transaction=False)
        taken = []
        event_waits: list[tuple[str, str, dict[str, Any]] | None] = []
        for event_id, event in batch:
            try:
                task = Task.from_event(event_id, event)
                keys, args = self._registration(task, event)
            except (BadTask, EventEncodingError) as error:
                # Not even a FAILURE can be sent (no workflow, fields that are not JSON):
                # this entry alone goes to the dead letters, the rest of the batch on.
                self.reject(event_id, str(error))
                continue
            self._register(keys=keys, args=[self.group, event_id, *args], client=pipe)
            taken.append(event_id)
            is_event = args[0] == "event"
            kind = keys[3][len(self.keys.wait_events("")) :] if is_event else ""
            event_waits.append((task.id, kind, orjson.loads(args[3])) if is_event else None)
        registered = []
        done = []
        # One script failing (a Redis error) must not fail the others of the pipeline.
        replies = pipe.execute(raise_on_error=False)
        for outcome in replies:
            if isinstance(outcome, Exception) and is_weather(outcome):
                raise outcome  # Redis refused, not the task: the batch waits it out
        for event_id, outcome, wait in zip(taken, replies, event_waits, strict=True):
            if isinstance(outcome, Exception):
                log.warning("wait task %s: %s", event_id, outcome)
                self.reject(event_id, f"wait_register.lua: {outcome}")
                continue
            done.append(event_id)
            self.outcomes[int(outcome)] += 1
            if wait is not None and int(outcome) == 2:  # now waiting
                registered.append(wait)
        if registered:
            # An event written between the start-task and this registration may have
            # passed the watcher already: look back for it.
            catch_up(self.connection, self.keys, self._complete, registered)
        return done  # wait_register.lua acknowledged each of them

    def _registration(self, task: Task, event: dict[str, Any]) -> tuple[list[str], list[Any]]:
        """KEYS and the ARGV after group and entry id for wait_register.lua.

        Whatever is wrong with the task's parameters or input (a bad duration, a
        template that does not render, an integer that JSON cannot carry) becomes
        its FAILURE here, so one bad task never takes its batch down with it."""
        k = self.keys
        # The stream the start-task came from: a priority's own, or the kind's.
        base = [self.current_stream or k.tasks(WAIT_KIND), k.lifecycle, k.waits]
        try:
            spec = wait_spec(task)
            record = wait_record(event, self.consumer)
            if isinstance(spec, EventWait):
                wait = _encode_wait(task, spec)
        except Exception as error:  # noqa: BLE001 - any of them is this task's failure
            message = str(error) if isinstance(error, WorkerError) else error_text(error)
            log.info("task %s: %s", task.id, message)
            failed = wait_record(event, self.consumer, output=b"{}")
            return [*base, k.waits, k.waits], ["fail", task.id, failed, message]
        if isinstance(spec, Delay):
            # Due from the start-task's id (Redis time when the lifecycle started it),
            # so that a re-registration after a crash keeps the same due time.
            due = entry_order(task.event_id)[0] + round(spec.seconds * 1000)
            return [*base, k.wait_delays, k.waits], ["delay", task.id, record, due]
        if isinstance(spec, EventWait):
            return [*base, k.wait_events(spec.event), k.waits], ["event", task.id, record, wait]
        assert isinstance(spec, Latch)
        latch = [k.latch(spec.name), k.latch_waiters(spec.name)]
        return [*base, *latch], [spec.operation, task.id, record, spec.name]


def _encode_wait(task: Task, spec: EventWait) -> bytes:
    """What ``{flow}:wait:event:<kind>`` holds for one wait: who it is for (``workflow``,
    ``channel``), what the event must carry (``match``), from when (``since``)."""
    try:
        return orjson.dumps(
            {
                "workflow": task.workflow,
                "channel": spec.channel,
                "match": spec.match,
                "since": task.event_id,
                "receipt": spec.receipt,
            }
        )
    except TypeError as error:  # e.g. an integer beyond 64 bits in the match
        raise WaitParameterError(f"{task.name}: parameter 'match' is not JSON: {error}") from None


def delay_pump(client: redis.Redis, keys: Keys, interval: float = 0.1, batch: int = 500) -> Pump:
    """The pump that ends due ``wait:delay`` tasks (``fire_delays.lua``), each once."""
    script = load_script(client, "fire_delays")
    return Pump(
        script,
        [keys.wait_delays, keys.waits, keys.lifecycle],
        name="wait-delays",
        interval=interval,
        batch=batch,
    )


class WaitWorker:
    """Serves the built-in ``wait:`` kind: the task listener, the delay pump and the event
    watcher, on one connection pool.

    ``listen()`` blocks until ``stop()`` (or SIGINT/SIGTERM when called from the main
    thread with ``handle_signals``); ``start()`` runs it in a daemon thread and
    returns the thread. ``events=False`` leaves wait:event to other WaitWorkers.
    """

    def __init__(
        self,
        keys: Keys | None = None,
        *,
        pool: redis.ConnectionPool | None = None,
        url: str | None = None,
        consumer: str | None = None,
        claim_idle: float = 10.0,
        block_ms: int = 1000,
        poll_interval: float = 0.1,
        events: bool = True,
        handle_signals: bool = True,
    ) -> None:
        self.keys = keys or Keys()
        name = consumer or default_consumer_name()
        options: dict[str, Any] = {
            "pool": pool,
            "url": url,
            "consumer": name,
            "claim_idle": claim_idle,
            "block_ms": block_ms,
        }
        self.tasks = WaitTaskListener(self.keys, handle_signals=handle_signals, **options)
        options["pool"] = self.tasks.pool  # one pool for all three
        options["url"] = None
        self.watcher = EventWatcher(self.keys, handle_signals=False, **options) if events else None
        self.delays = delay_pump(self.tasks.connection, self.keys, interval=poll_interval)
        self._thread: threading.Thread | None = None

    @property
    def consumer(self) -> str:
        return self.tasks.consumer

    @property
    def listeners(self) -> list[EventListener]:
        """Its listeners (for metrics): the task listener and the event watcher."""
        return [self.tasks] if self.watcher is None else [self.tasks, self.watcher]

    def listen(self) -> None:
        """Run until stopped; the task listener in this thread, the others in daemon threads."""
        watcher_thread = None
        if self.watcher is not None:
            watcher_thread = threading.Thread(
                target=self.watcher.listen, name="wait-events", daemon=True
            )
            watcher_thread.start()
        self.delays.start()
        log.info("wait worker %s: serving %s", self.consumer, self.keys.tasks(WAIT_KIND))
        try:
            self.tasks.listen()
        finally:
            self.delays.stop()
            if self.watcher is not None and watcher_thread is not None:
                self.watcher.stop()
                watcher_thread.join(timeout=10)

    def start(self) -> threading.Thread:
        """``listen()`` in a daemon thread; returns it (join it after ``stop()``)."""
        self._thread = threading.Thread(target=self.listen, name="wait-worker", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        """Ask every loop to stop; thread-safe, idempotent. Waits stay registered."""
        self.tasks.stop()
        if self.watcher is not None:
            self.watcher.stop()
        self.delays.stop()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
