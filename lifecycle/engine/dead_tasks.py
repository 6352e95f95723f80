"""Dead-lettered start-tasks fail their task, so no workflow waits on them forever.

A task worker that gives up on a start-task (its ``process()`` raised on every
allowed delivery, or the entry could not be delivered: ``max-deliveries``)
moves it to ``{flow}:tasks:<kind>:dead`` and nobody answers it: without this,
its workflow would stay ``running``. :class:`DeadTasks` reads the dead-letter
stream of every task kind (those that appear later too, through rqse's
``discover``) as group ``lifecycle`` and answers each dead-lettered start-task
with a FAILURE ``end-task`` built from the original fields — it echoes the
attempt's token, so the lifecycle takes it — with the error
``start-task dead-lettered (<reason>): <error>``. The lifecycle then retries
the task or fails the workflow, as the node's policy says. An answer for an
attempt that has already ended is refused by the lifecycle like any stale one.

A dead-lettered ``start-tasks`` pack fails each of its tasks the same way: one
FAILURE per task, all emitted with the dead letter's acknowledgement; a malformed
task of it is one WARNING line, skipped.

An ``oversize`` start-task (its dead letter does not copy the fields) is read
from its stream, where it stays until trimmed. Dead letters that are not
start-tasks are acknowledged silently; garbage (no original fields, values
that are not JSON, a start-task without a workflow) is one WARNING line,
acknowledged.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import orjson
import redis

from lifecycle.errors import BadEvent
from lifecycle.events import START_TASK, START_TASKS, end_task, parse_start_tasks
from lifecycle.keys import DEFAULT_KIND, Keys
from lifecycle.priorities import task_streams
from rqse import EventListener
from rqse.deadletter import DEAD_LETTER, OVERSIZE
from rqse.errors import RqseError
from rqse.keys import dead_letter_key
from rqse.weather import is_weather

__all__ = ["DeadTasks", "dead_task_error"]

log = logging.getLogger(__name__)
_START_TASK_TEXT = orjson.dumps(START_TASK).decode()  # the kind as a dead letter holds it
_START_TASKS_TEXT = orjson.dumps(START_TASKS).decode()
# What becomes of a dead letter that cannot be answered, and of one task of a pack.
_DROPPED = "acknowledged, nothing answered"
_SKIPPED = "that task skipped, nothing answered for it"
# The start-task fields an end-task echoes (lifecycle.events.end_task).
_ECHOED = ("workflow", "key", "index", "attempt", "token")


def dead_task_error(reason: Any, error: Any) -> str:
    """The error of the FAILURE answering a dead-lettered start-task."""
    return f"start-task dead-lettered ({reason}): {error}"


class DeadTasks(EventListener):
    """Answers every dead-lettered start-task of every kind with a FAILURE end-task.

    Runs beside the lifecycle worker (:class:`lifecycle.worker.LifecycleWorker`
    starts one in a thread); several share the ``lifecycle`` group, so each dead
    letter is answered once. Kinds are followed from ``{flow}:kinds`` every
    ``discover_every`` seconds; only dead-letter streams that exist are joined (the
    first dead letter creates one), so quiet kinds cost nothing.
    """

    def __init__(self, keys: Keys | None = None, **options: Any) -> None:
        self.keys = keys or Keys()
        options.setdefault("discover_every", 2.0)
        options.setdefault("handle_signals", False)
        super().__init__(
            dead_letter_key(self.keys.tasks(DEFAULT_KIND)),
            self.keys.lifecycle_group,
            [DEAD_LETTER],
            discover=self._dead_streams,
            **options,
        )

    def _dead_streams(self) -> list[str]:
        """The dead-letter streams of every known task stream (priority streams included)
        that exist by now."""
        found = task_streams(self.connection, self.keys)
        streams = [dead_letter_key(t.stream) for t in found]
        followed = set(self.streams)
        unknown = [s for s in streams if s not in followed]
        if not unknown:
            return []
        pipe = self.connection.pipeline(transaction=False)
        for stream in unknown:
            pipe.exists(stream)
        return [s for s, found in zip(unknown, pipe.execute(), strict=True) if found]

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        fields = event.get("fields")
        if fields is None and event.get("reason") == OVERSIZE:
            fields = self._original(event)  # not copied into the dead letter: still in its stream
        if not isinstance(fields, dict):
            return self._garbage(event_id, "no original fields")
        failure = dead_task_error(event.get("reason"), event.get("error"))
        if fields.get("kind") == _START_TASKS_TEXT:
            return self._fail_pack(event_id, event, fields, failure)
        if fields.get("kind") != _START_TASK_TEXT:
            return False  # not a start-task (an end-task, garbage): nobody waits on it
        try:
            # Only what the answer echoes: the input may be megabytes.
            original = {name: orjson.loads(fields[name]) for name in _ECHOED if name in fields}
        except (orjson.JSONDecodeError, TypeError) as error:
            return self._garbage(event_id, f"original fields not JSON ({error})")
        return self._fail(event_id, original, failure)

    def _fail_pack(
        self, event_id: str, event: dict[str, Any], fields: dict[str, Any], failure: str
    ) -> bool:
        """Fail each task of a dead-lettered start-tasks pack, as a lone one's; a line
        for each of its tasks that cannot be (lifecycle.events.parse_start_tasks)."""
        original_id = event.get("id") if isinstance(event.get("id"), str) else event_id
        try:
            tasks = orjson.loads(fields.get("tasks") or "null")
            starts, bad = parse_start_tasks(str(original_id), {"tasks": tasks})
        except (orjson.JSONDecodeError, TypeError) as error:
            return self._garbage(event_id, f"start-tasks field 'tasks' not JSON ({error})")
        except BadEvent as error:
            return self._garbage(event_id, str(error))
        for reason in bad:
            self._garbage(event_id, reason, _SKIPPED)
        failed = [self._fail(event_id, start, failure, packed=True) for start in starts]
        return any(failed)

    def _fail(
        self, event_id: str, start: dict[str, Any], failure: str, packed: bool = False
    ) -> bool:
        """Answer the start-task ``start`` (its fields decoded) with a FAILURE; ``packed``:
        one task of a start-tasks pack."""
        workflow, key = start.get("workflow"), start.get("key")
        if not isinstance(workflow, str) or not isinstance(key, str):
            what = f"a task of {START_TASKS}" if packed else START_TASK
            return self._garbage(
                event_id,
                f"{what} without string workflow and key: {workflow!r}, {key!r}",
                _SKIPPED if packed else _DROPPED,
            )
        self.emit(end_task(start, error=failure, worker=self.consumer), self.keys.lifecycle)
        log.info("workflow %s: task %s failed: %s", workflow, key, failure)
        return True

    def _original(self, event: dict[str, Any]) -> dict[str, str] | None:
        """The fields an ``oversize`` dead letter left out, from the entry in its stream
        (None once trimmed): only the few the answer needs (a pack's ``tasks`` whole)."""
        stream, entry_id = event.get("stream"), event.get("id")
        if not isinstance(stream, str) or not isinstance(entry_id, str):
            return None
        try:
            rows: Any = self.connection.xrange(stream, entry_id, entry_id, count=1)
        except redis.ResponseError as error:
            if is_weather(error):
                raise  # Redis refused for now (BUSY, MASTERDOWN...): asked again later
            return None  # not a stream, a malformed id: garbage
        if not rows:
            return None
        wanted = {name.encode() for name in ("kind", "tasks", *_ECHOED)}
        return {
            name.decode(): value.decode("utf-8", "replace")
            for name, value in rows[0][1].items()
            if name in wanted
        }

    def _garbage(self, event_id: str, why: str, outcome: str = _DROPPED) -> bool:
        log.warning("dead letter %s of %s: %s; %s", event_id, self.current_stream, why, outcome)
        return False


class DeadTasksThread:
    """A :class:`DeadTasks` listening in a daemon thread: ``start()``, ``stop()``."""

    def __init__(self, listener: DeadTasks) -> None:
        self.listener = listener
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="dead-tasks", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self.listener.listen()
        except RqseError as error:  # Redis refused (an ACL without the grant): one line
            log.error("dead tasks: %s; dead-lettered start-tasks go unanswered", error)
        except Exception:  # noqa: BLE001 - the thread's last line: say why it ended
            log.exception("dead tasks: listener ended; dead-lettered start-tasks go unanswered")

    def stop(self, timeout: float = 10.0) -> None:
        self.listener.stop()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
