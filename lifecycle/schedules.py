"""Schedules: a stored flow started at the fire times of a cron expression or an interval.

A schedule holds the content hash of a graph compiled when it was added (stored
like ``run`` stores one), its input, and its policies. The lifecycle workers fire
it (:class:`lifecycle.engine.schedules.SchedulePump`): each reads Redis ``TIME``,
takes the schedules whose next fire time has come, works out here which fire
times to start, and hands them to ``fire_schedule.lua``, which starts them and
moves the next fire time in one step, only if no other worker moved it first.
So with N workers each fire time starts one workflow, whose id is the schedule's
name and the fire time (``nightly@2026-11-25T02:00:00Z``).

Fire times: ``cron`` through croniter, 5 fields or 6 with seconds first, in the
schedule's time zone (DST by croniter's rules: a time skipped by the clock change
fires at the first time that exists after it; a time the clock repeats fires at
both, an hour apart, as two runs with two ids);
``every`` at the multiples of the interval since the Unix epoch (``--every 1h``
fires on the hour, UTC).

A fire time found less than :data:`GRACE_MS` (and less than one period) late is
on time and starts; older ones were missed (the workers were down) and start as
the catch-up policy says: ``none``, ``one`` (the latest due, once) or ``all``
(the latest :data:`CATCH_UP_CAP`). The overlap policy looks at the run before
those: the fire times one call catches up start together, or are all skipped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
import redis
from croniter import CroniterBadDateError, CroniterError, croniter  # type: ignore[import-untyped]

from flowlang.graph import Graph
from flowlang.limits import DEFAULT_LIMITS, encode_value
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.client import Client
from lifecycle.errors import LifecycleError
from lifecycle.keys import Keys
from lifecycle.priorities import check_priority
from lifecycle.submit import encode_event, encode_start, register_streams, validate_policies
from rqse import lua

__all__ = [
    "CATCH_UP",
    "CATCH_UP_CAP",
    "GRACE_MS",
    "OVERLAP",
    "Fired",
    "Plan",
    "Schedule",
    "ScheduleError",
    "Schedules",
    "UnknownSchedule",
    "check_name",
    "run_id",
]

log = logging.getLogger(__name__)
_SCRIPTS = lua.scripts_dir(__file__)

OVERLAP = ("skip", "allow", "cancel-previous")
CATCH_UP = ("none", "one", "all")
CATCH_UP_CAP = 100  # catch-up all starts at most the latest this many missed fire times
CATCH_UP_BYTES = 64 << 20  # of inputs in one firing: "all" keeps the latest that fit
MAX_EVERY_MS = 3650 * 86_400_000  # ten years: fire times stay dates Python can show
GRACE_MS = 5000  # a fire time found later than this (or than one period) was missed
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_PAUSED = float("inf")  # a paused schedule's score in Keys.schedules: never due


class ScheduleError(LifecycleError):
    """Raised when a schedule's name, expression, time zone or options are bad."""


class UnknownSchedule(ScheduleError):
    """Raised when no schedule has the name given."""


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ScheduleError(
            f"schedule name {name!r}: expected 1 to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def _zone(timezone: str) -> ZoneInfo:
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"--timezone {timezone!r}: unknown time zone (an IANA name, e.g. Europe/Berlin or UTC)"
        ) from None


def run_id(name: str, at_ms: int, tagged: bool = False) -> str:
    """The workflow id of the run of ``name`` for fire time ``at_ms``: the idempotency
    key. Whole seconds for fire times, milliseconds for run-now. ``tagged`` (a
    deployment of several partitions): the name is written ``{name}``, so that the runs
    live in their schedule's partition (lifecycle.partitions)."""
    moment = datetime.fromtimestamp(at_ms / 1000, UTC)
    shown = f"{{{name}}}" if tagged else name
    if at_ms % 1000:
        return f"{shown}@{moment.strftime('%Y-%m-%dT%H:%M:%S')}.{at_ms % 1000:03d}Z"
    return f"{shown}@{moment.strftime('%Y-%m-%dT%H:%M:%SZ')}"


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule's definition, stored as JSON in its hash (``records.SCHEDULE_SPEC``).

    Exactly one of ``cron`` and ``every_ms``. ``priority``, ``concurrency_key`` and
    ``max_running`` are passed to each start (see :meth:`Schedules.start_fields`): the
    overlap policy looks at the schedule's last run, a concurrency key at every running
    workflow under the key (other schedules' and submitters' too)."""

    name: str
    graph: str  # content hash of the compiled graph ({flow}:graph:<hash>)
    flow: str | None  # the flow's name
    file: str  # where the flow was read from, for people
    cron: str | None = None
    every_ms: int | None = None
    timezone: str = "UTC"
    overlap: str = "skip"
    catch_up: str = "one"
    input: Any = None
    priority: int = 0
    concurrency_key: str | None = None
    max_running: int | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        if (self.cron is None) == (self.every_ms is None):
            raise ScheduleError(f"schedule {self.name}: give one of --cron and --every")
        if self.overlap not in OVERLAP:
            raise ScheduleError(f"--overlap {self.overlap!r}: expected one of {', '.join(OVERLAP)}")
        if self.catch_up not in CATCH_UP:
            raise ScheduleError(
                f"--catch-up {self.catch_up!r}: expected one of {', '.join(CATCH_UP)}"
            )
        _zone(self.timezone)
        check_priority(self.priority, f"schedule {self.name}: --priority")
        problem = ev.concurrency_problem(self.concurrency_key, self.max_running)
        if problem is not None:
            raise ScheduleError(f"schedule {self.name}: {problem}")
        if self.every_ms is not None and not 1000 <= self.every_ms <= MAX_EVERY_MS:
            raise ScheduleError(
                f"--every {self.every_ms}ms: expected at least 1s and at most "
                f"{MAX_EVERY_MS // 86_400_000} days"
            )
        if self.cron is not None:
            fields = len(self.cron.split())
            if fields not in (5, 6):
                raise ScheduleError(
                    f"--cron {self.cron!r}: {fields} fields, expected 5 (minute hour day month "
                    "weekday) or 6 (second first)"
                )
            try:
                self._cron(0).get_next(datetime)
            except CroniterBadDateError:
                raise ScheduleError(f"--cron {self.cron!r}: matches no date, never fires") from None
            except (CroniterError, ValueError, KeyError) as error:
                raise ScheduleError(f"--cron {self.cron!r}: {error}") from None

    @property
    def when(self) -> str:
        """The schedule as people write it: the cron expression or ``every 30s``."""
        if self.cron is not None:
            return self.cron
        every = self.every_ms or 0
        for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if every % size == 0:
                return f"every {every // size}{unit}"
        return f"every {every}ms"

    def _cron(self, start_ms: int) -> croniter:
        start = datetime.fromtimestamp(start_ms / 1000, _zone(self.timezone))
        six = len((self.cron or "").split()) == 6
        return croniter(self.cron or "", start, second_at_beginning=six)

    def next_after(self, ms: int) -> int:
        """The first fire time strictly after ``ms``."""
        if self.every_ms is not None:
            return (ms // self.every_ms + 1) * self.every_ms
        return _ms(self._cron(ms).get_next(datetime))

    def fires_back(self, upto_ms: int) -> Iterator[int]:
        """The fire times at or before ``upto_ms``, latest first."""
        if self.every_ms is not None:
            at = upto_ms // self.every_ms * self.every_ms
            while True:
                yield at
                at -= self.every_ms
        cron = self._cron(upto_ms + 1)  # get_prev is strictly before its start
        while True:
            yield _ms(cron.get_prev(datetime))

    def on_time(self, at_ms: int, now_ms: int) -> bool:
        """Whether fire time ``at_ms``, seen at ``now_ms``, is late rather than missed."""
        return now_ms - at_ms < min(GRACE_MS, self.next_after(at_ms) - at_ms)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> Schedule:
        data = orjson.loads(raw)
        return cls(**data)


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Fired:
    """What one call to fire a schedule did: workflows ``started`` (their ids in
    ``runs``), fire times ``skipped`` (overlap skip, or missed and not caught up);
    ``moved``: another worker had fired it first, or it was paused or removed."""

    started: int
    skipped: int
    last: str | None
    runs: tuple[str, ...] = ()
    moved: bool = False


@dataclass(frozen=True, slots=True)
class Plan:
    """The runs one firing of a schedule starts, and what they were worked out from:
    its last run, its next fire time then (None: run-now) and after (None: kept)."""

    schedule: Schedule
    last: str  # '' when it never ran
    runs: list[dict[str, Any]]  # {"id", "at", "start": the start-workflow's fields, flat}
    now_ms: int
    expected_next: int | None
    new_next: int | None
    missed: int  # fire times passed over, not started


class Schedules:
    """Add, list, pause, resume, remove and fire the schedules of one deployment."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None) -> None:
        self.redis = client
        self.keys = keys or Keys()
        self._fire = lua.load_script(client, "fire_schedule", _SCRIPTS)

    def run_id(self, name: str, at_ms: int) -> str:
        """The id of ``name``'s run at ``at_ms`` in this deployment (:func:`run_id`)."""
        return run_id(name, at_ms, tagged=bool(self.keys.home))

    def now(self) -> int:
        """Redis's clock (ms): the one every worker and command shares."""
        seconds, micros = self.redis.time()  # type: ignore[misc]
        return int(seconds) * 1000 + int(micros) // 1000

    # -- definitions -----------------------------------------------------------------

    def add(self, schedule: Schedule, graph: Graph, now_ms: int | None = None) -> int:
        """Store ``graph`` and ``schedule``; return its first fire time (ms).
        :class:`ScheduleError` when the name is taken."""
        validate_policies(graph)
        # The input is checked against the limits now, not at its first fire.
        encode_value(schedule.input, DEFAULT_LIMITS, f"the input of schedule {schedule.name}")
        key = self.keys.schedule(schedule.name)
        if not self.redis.hsetnx(key, rec.SCHEDULE_SPEC, schedule.to_json()):
            raise ScheduleError(
                f"schedule {schedule.name!r} exists (python -m lifecycle schedule remove "
                f"{schedule.name} first)"
            )
        first = schedule.next_after(self.now() if now_ms is None else now_ms)
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.graph(schedule.graph), graph.to_json(), nx=True)
        register_streams(pipe, self.keys, graph, schedule.priority)
        pipe.hset(key, rec.SCHEDULE_NEXT, first)
        pipe.zadd(self.keys.schedules, {schedule.name: first})
        pipe.execute()
        return first

    def get(self, name: str) -> Schedule:
        raw = self.redis.hget(self.keys.schedule(check_name(name)), rec.SCHEDULE_SPEC)
        if raw is None:
            raise UnknownSchedule(f"no schedule {name!r} (python -m lifecycle schedule list)")
        return Schedule.from_json(raw)  # type: ignore[arg-type]

    def pause(self, name: str) -> bool:
        """Fire nothing until resumed; False when it already was paused."""
        self.get(name)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hsetnx(self.keys.schedule(name), rec.SCHEDULE_PAUSED, self.now())
        pipe.zadd(self.keys.schedules, {name: _PAUSED}, xx=True)
        return bool(pipe.execute()[0])

    def resume(self, name: str) -> int | None:
        """Fire again from the next fire time after now (what fell due while paused is
        not caught up); return it, None when it was not paused."""
        schedule = self.get(name)
        key = self.keys.schedule(name)
        if self.redis.hget(key, rec.SCHEDULE_PAUSED) is None:
            return None
        first = schedule.next_after(self.now())
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, rec.SCHEDULE_NEXT, first)
        pipe.hdel(key, rec.SCHEDULE_PAUSED)
        pipe.zadd(self.keys.schedules, {name: first}, xx=True)
        pipe.execute()
        return first

    def remove(self, name: str) -> None:
        """Forget the schedule and its runs index; its workflows stay, as any others."""
        self.get(name)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrem(self.keys.schedules, name)
        pipe.delete(self.keys.schedule(name), self.keys.schedule_runs(name))
        pipe.execute()

    def names(self) -> list[str]:
        rows: Any = self.redis.zrangebyscore(self.keys.schedules, "-inf", "+inf")
        return sorted(member.decode() for member in rows)

    def runs(self, name: str) -> list[str]:
        """The ids of the workflows ``name`` started that may still be in Redis, oldest
        first (a caller skips those whose record is gone)."""
        self.get(name)
        rows: Any = self.redis.zrangebyscore(self.keys.schedule_runs(name), "-inf", "+inf")
        return [member.decode() for member in rows]

    def describe(self) -> list[dict[str, Any]]:
        """One summary per schedule, by name: definition, next fire time, last run and
        its state (None when its record is gone), counters."""
        names = self.names()
        pipe = self.redis.pipeline(transaction=False)
        fields = (rec.SCHEDULE_SPEC, rec.SCHEDULE_NEXT, rec.SCHEDULE_PAUSED, rec.SCHEDULE_LAST)
        for name in names:
            pipe.hmget(self.keys.schedule(name), *fields, rec.SCHEDULE_FIRED, rec.SCHEDULE_SKIPPED)
        rows: list[dict[str, Any]] = []
        for name, values in zip(names, pipe.execute(), strict=True):
            spec_raw, next_raw, paused, last, fired, skipped = values
            if spec_raw is None:
                continue  # removed meanwhile
            spec = Schedule.from_json(spec_raw)
            last_id = last.decode() if last else None
            rows.append(
                {
                    "name": name,
                    "flow": spec.flow,
                    "file": spec.file,
                    "graph": spec.graph,
                    "schedule": spec.when,
                    "timezone": spec.timezone,
                    "overlap": spec.overlap,
                    "catch_up": spec.catch_up,
                    "catch_up_cap": CATCH_UP_CAP,
                    "priority": spec.priority,
                    "concurrency_key": spec.concurrency_key,
                    "max_running": spec.max_running,
                    "paused": paused is not None,
                    "next": None if paused else _iso(int(next_raw or 0)),
                    "last_run": last_id,
                    "last_state": None,
                    "fired": int(fired or 0),
                    "skipped": int(skipped or 0),
                }
            )
        lasts = [row["last_run"] for row in rows if row["last_run"]]
        states = dict(zip(lasts, Client(self.redis, self.keys).statuses(lasts), strict=True))
        for row in rows:
            status = states.get(row["last_run"])
            row["last_state"] = status.state if status is not None else None
        return rows

    # -- firing ----------------------------------------------------------------------

    def start_fields(self, schedule: Schedule, workflow_id: str) -> list[str]:
        """The start-workflow event of one run, flat (field, value, ...): the one place a
        schedule's submission is built (its priority's streams were registered by
        :meth:`add`)."""
        fields = encode_start(
            workflow_id,
            schedule.graph,
            schedule.input,
            DEFAULT_LIMITS,
            schedule.priority,
            schedule.concurrency_key,
            schedule.max_running,
            claimed=True,  # fire_schedule.lua claims the id in the index
        )
        return _flat(fields)

    def stop_fields(self, schedule: Schedule, workflow_id: str, by: str) -> list[str]:
        """The terminate-workflow event that cancel-previous sends for ``workflow_id``."""
        reason = f"schedule {schedule.name}: overlapped by its run {by}"
        return _flat(encode_event(ev.terminate_workflow(workflow_id, reason)))

    def fire_due(self, now_ms: int | None = None, batch: int = 100) -> int:
        """Fire every schedule due at ``now_ms`` (default: Redis's clock), ``batch`` at a
        time; return how many workflows started.

        Every batch is judged by the one clock read first: a fire time is late, not
        missed, however many schedules fell due with it (``--catch-up`` is for the time
        no lifecycle worker ran, not for the time this call takes)."""
        now = self.now() if now_ms is None else now_ms
        started, tried = 0, set()
        while True:
            rows = self.redis.zrangebyscore(self.keys.schedules, "-inf", now, start=0, num=batch)
            names = [member.decode() for member in rows]  # type: ignore[union-attr]
            fresh = [name for name in names if name not in tried]
            for name in fresh:
                tried.add(name)
                started += self._fire_one(name, now)
            if len(names) < batch or not fresh:  # all done, or only those that stay due
                return started

    def _fire_one(self, name: str, now: int) -> int:
        try:
            return self.fire(name, now).started
        except (ScheduleError, ValueError, TypeError, OverflowError, redis.DataError) as error:
            # A definition that cannot be fired would be due at every call, ahead of the
            # others: park it.
            log.error("schedule %s: cannot fire (%s); paused", name, error)
            self.redis.hsetnx(self.keys.schedule(name), rec.SCHEDULE_PAUSED, now)
            self.redis.zadd(self.keys.schedules, {name: _PAUSED}, xx=True)
            return 0

    def fire(self, name: str, now_ms: int) -> Fired:
        """Start what ``name``'s fire times due at ``now_ms`` call for, once however many
        workers call this for the same fire times."""
        plan = self.plan(name, now_ms)
        return Fired(0, 0, None, moved=True) if plan is None else self.apply(plan)

    def plan(self, name: str, now_ms: int) -> Plan | None:
        """What firing ``name`` at ``now_ms`` would start, as read now (None: paused or
        removed); :meth:`apply` starts it unless another worker fired it meanwhile."""
        key = self.keys.schedule(name)
        spec_raw, next_raw, paused, last = self.redis.hmget(
            key, rec.SCHEDULE_SPEC, rec.SCHEDULE_NEXT, rec.SCHEDULE_PAUSED, rec.SCHEDULE_LAST
        )  # type: ignore[misc]
        if spec_raw is None or paused is not None or next_raw is None:
            return None
        schedule = Schedule.from_json(spec_raw)
        first = int(next_raw)
        due: list[int] = []  # latest first
        for at in schedule.fires_back(now_ms):
            if at < first or len(due) >= CATCH_UP_CAP:
                break
            due.append(at)
        if schedule.every_ms is not None and due:
            missed_total = (due[0] - first) // schedule.every_ms + 1
        else:
            missed_total = len(due)
        if schedule.catch_up == "all":
            # Each run's start carries the input into one script call: its arguments stay
            # far below what Redis takes in one request (the latest runs are kept).
            size = len(orjson.dumps(schedule.input))
            chosen = due[: max(1, CATCH_UP_BYTES // max(size, 1))]
        elif schedule.catch_up == "one":
            chosen = due[:1]
        else:
            chosen = [at for at in due if schedule.on_time(at, now_ms)]
        chosen.reverse()
        runs = [
            {
                "id": (workflow_id := self.run_id(name, at)),
                "at": at,
                "start": self.start_fields(schedule, workflow_id),
            }
            for at in chosen
        ]
        return Plan(
            schedule,
            _text(last) if last else "",
            runs,
            now_ms,
            expected_next=first,
            new_next=schedule.next_after(now_ms),
            missed=missed_total - len(chosen),
        )

    def run_now(self, name: str) -> Fired:
        """Start one run now, besides the fire times (which stay as they were), under
        the schedule's overlap policy; paused or not."""
        schedule = self.get(name)
        for _ in range(10):  # the last run changed under us: read it again
            last = self.redis.hget(self.keys.schedule(name), rec.SCHEDULE_LAST)
            now = self.now()
            workflow_id = self.run_id(name, now if now % 1000 else now + 1)
            run = {
                "id": workflow_id,
                "at": now,
                "start": self.start_fields(schedule, workflow_id),
            }
            last_id = last.decode() if isinstance(last, bytes) else ""
            fired = self.apply(Plan(schedule, last_id, [run], now, None, None, 0))
            if not fired.moved:
                return fired
        raise ScheduleError(f"schedule {name}: its last run kept changing; try again")

    def apply(self, plan: Plan) -> Fired:
        """Start ``plan``'s runs (``fire_schedule.lua``), if the schedule's next fire time
        and last run are still those it was made from."""
        schedule, last, runs = plan.schedule, plan.last, plan.runs
        expected_next, new_next = plan.expected_next, plan.new_next
        by = runs[0]["id"] if runs else ""
        script_plan = {
            "now": plan.now_ms,
            "missed": plan.missed,
            "stop_last": self.stop_fields(schedule, last, by) if last else [],
            "runs": runs,
        }
        reply = self._fire(
            keys=[
                self.keys.schedules,
                self.keys.schedule(schedule.name),
                self.keys.schedule_runs(schedule.name),
                self.keys.workflows,
                self.keys.lifecycle,
                self.keys.compacted,
            ],
            args=[
                schedule.name,
                "" if expected_next is None else expected_next,
                "" if new_next is None else new_next,
                last,
                schedule.overlap,
                self.keys.workflow(""),
                rec.ENDED,
                orjson.dumps(script_plan),
                rec.SCHEDULE_NEXT,
                rec.SCHEDULE_LAST,
                rec.SCHEDULE_FIRED,
                rec.SCHEDULE_SKIPPED,
            ],
        )
        started, skipped, new_last = int(reply[0]), int(reply[1]), _text(reply[2])
        if started < 0:
            return Fired(0, 0, None, moved=True)
        begun = tuple(_text(workflow_id) for workflow_id in reply[3:])
        if started or skipped:
            log.info("schedule %s: started %d, skipped %d", schedule.name, started, skipped)
        return Fired(started, skipped, new_last or None, begun)


def _flat(fields: dict[str, bytes]) -> list[str]:
    return [part for name, value in fields.items() for part in (name, _text(value))]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")
