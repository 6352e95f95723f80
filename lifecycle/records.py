"""Names of what the engine stores per workflow: the fields of its hash and its states.

One place for each name, used by every reader and writer in Python and passed
to the Lua scripts as arguments (they spell none of them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from flowlang.machine import FAILED, FINISHED, RUNNING, TERMINATED

__all__ = [
    "ARRIVAL_PREFIX",
    "COMPACTED",
    "COMPACTED_PREFIXES",
    "CONCURRENCY",
    "CREATED",
    "ENDED",
    "END_PREFIX",
    "ENDED_STATES",
    "EXPIRES",
    "FAILED",
    "FANIN_PREFIX",
    "FINISHED",
    "GRAPH",
    "INPUT",
    "NAME",
    "OUTPUT_PREFIX",
    "PAUSED",
    "PAUSED_STATE",
    "QUEUED_PREFIX",
    "QUEUED_STATE",
    "SHOWN_STATES",
    "PRIORITY",
    "RELATIVE_BELOW",
    "RUNNING",
    "RUNNING_PREFIX",
    "SALT",
    "SCHEDULE_FIRED",
    "SCHEDULE_LAST",
    "SCHEDULE_NEXT",
    "SCHEDULE_PAUSED",
    "SCHEDULE_SKIPPED",
    "SCHEDULE_SPEC",
    "START_PREFIX",
    "STATE",
    "STATES",
    "TERMINATED",
    "VERSION",
    "WAITING_PREFIX",
    "created_ms",
    "end_field",
    "is_queued",
    "record_offset",
    "record_time",
    "shown_state",
    "start_field",
    "whole_end",
]

# Fields of {flow}:wf:<id> (lifecycle.keys.Keys.workflow).
VERSION = "v"  # incremented by every commit: the advance's compare-and-set
STATE = "s"  # the machine's state, JSON (flowlang.machine.State)
GRAPH = "g"  # content hash of the compiled graph ({flow}:graph:<hash>)
SALT = "t"  # secret of the workflow's attempt tokens (absent: workflows from before tokens)
NAME = "name"  # the flow's name, when it has one
CREATED = "created"  # ms
ENDED = "ended"  # ms, once it ended
INPUT = "input"  # the workflow's input, JSON
PRIORITY = "priority"  # lifecycle.priorities, when not 0 (absent: 0)
# Present while the workflow is paused: JSON list of the task instance keys whose
# start-tasks are held, in the order they would have started. Resume sends them.
PAUSED = "p"
# A workflow under a concurrency key (run --concurrency-key K --max-running N): JSON
# {"key": K, "max": N}, with "queued": true while it waits its turn (its first
# start-tasks then held in PAUSED, sent when the key admits it). Kept for its whole
# life: its end releases its place under K.
CONCURRENCY = "k"
START_PREFIX = "n:"  # n:<key>: [attempt, started, input] of the instance's latest attempt
END_PREFIX = "o:"  # o:<key>: [ended, ok, output, error, worker] of its latest end
# ... or [ended, worker, successor]: ended well, its output the input the start record of
# its instance `successor` holds. A chain's step stores each output once, not twice (a
# plain successor's start record, ``Machine.plain_next``: it starts once a run, with that
# very value, which its retries and restarts keep). See whole_end.
# A task record's time (started, ended) is written as ms since the workflow's CREATED:
# 4 or 5 digits where the time itself takes 13, twice per task, and the records are most
# of a running workflow's hash (a chain of 10: 800 B instead of 1,056). Records written
# before that hold the time itself; they stay readable, as no time since 2001 is below
# this bound and no workflow runs for 31 years: see record_time.
RELATIVE_BELOW = 10**12
# Present once a finished workflow's task records (START_PREFIX, END_PREFIX) have been
# compacted away, its history left to the archive: the time (ms) they went.
COMPACTED = "c"
COMPACTED_PREFIXES = (START_PREFIX, END_PREFIX)
# Set on a finished workflow until it is compacted: when retention removes it (ms, 0: never).
EXPIRES = "x"
# The entries of a chunked state, one field each (lifecycle.stored_state):
RUNNING_PREFIX = "r:"  # r:<key>: the attempt of a running task instance
FANIN_PREFIX = "f:"  # f:<key>: an open iteration, [items left, items]
OUTPUT_PREFIX = "i:"  # i:<key>/<index>: an item's collected output
WAITING_PREFIX = "w:"  # w:<key>: arrivals so far at a join
ARRIVAL_PREFIX = "a:"  # a:<key>/<n>: the n-th arrival, [predecessor, value]
QUEUED_PREFIX = "q:"  # q:<key>/<n>: the n-th chunk of an iteration's items waiting to start

# Workflow states (State.status); a workflow that ended is in one of ENDED_STATES.
STATES = (RUNNING, FINISHED, FAILED, TERMINATED)
ENDED_STATES = (FINISHED, FAILED, TERMINATED)
# What readers show: a running workflow whose record has PAUSED is paused; one still
# waiting for its concurrency key (CONCURRENCY says "queued") is queued.
PAUSED_STATE = "paused"
QUEUED_STATE = "queued"
SHOWN_STATES = (RUNNING, PAUSED_STATE, QUEUED_STATE, FINISHED, FAILED, TERMINATED)


def shown_state(status: str, paused: bool, queued: bool = False) -> str:
    """The state readers show: ``queued`` for a running workflow still waiting for its
    concurrency key, ``paused`` for one whose record holds :data:`PAUSED`, else its
    status."""
    if status != RUNNING:
        return status
    return QUEUED_STATE if queued else PAUSED_STATE if paused else status


def is_queued(concurrency: bytes | str | None) -> bool:
    """Whether a :data:`CONCURRENCY` field's value says the workflow waits its turn."""
    if concurrency is None:
        return False
    try:
        value = orjson.loads(concurrency)
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, dict) and value.get("queued") is True


def start_field(key: str) -> str:
    return START_PREFIX + key


def end_field(key: str) -> str:
    return END_PREFIX + key


def created_ms(raw: bytes | str | int | None) -> int | None:
    """A record's :data:`CREATED` as a whole number of ms; None when it has none or it
    is not one (damaged by hand): task record times are then written as times."""
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def record_offset(now: int, created: int | None) -> int:
    """What a task record stores for the time ``now`` (ms) of a workflow created at
    ``created``: the time itself when the record has none (not the engine's writing)."""
    return now if created is None else now - created


def record_time(value: object, created: int | None) -> object:
    """The time (ms) a task record's ``value`` stands for (:func:`record_offset`): None
    for an offset whose base is unknown (``created`` missing or unreadable); a value
    that is not a whole number is given back as it is, for the caller to judge."""
    if type(value) is not int or value >= RELATIVE_BELOW:
        return value
    return None if created is None else created + value


def whole_end(record: list[Any], start_of: Callable[[str], Any]) -> list[Any]:
    """A decoded end record (:data:`END_PREFIX`) as ``[ended, ok, output, error,
    worker]``: one that names its successor takes its output from that instance's start
    record, ``start_of(key)`` (decoded; None, or not ``[attempt, started, input]``, when
    it is gone or damaged: the output is then unknown, None)."""
    if len(record) != 3:
        return record
    ended, worker, successor = record
    start = start_of(successor) if type(successor) is str else None
    output = start[2] if type(start) is list and len(start) == 3 else None
    return [ended, True, output, None, worker]


# Fields of a schedule's hash ({flow}:schedule:<name>, lifecycle.keys.Keys.schedule).
SCHEDULE_SPEC = "spec"  # JSON: the definition `schedule add` stored (lifecycle.schedules.Schedule)
SCHEDULE_NEXT = "next"  # ms: the next fire time (also its score in {flow}:schedules)
SCHEDULE_PAUSED = "paused"  # present (ms it was paused) while the schedule is paused
SCHEDULE_LAST = "last"  # the id of the last workflow it started
SCHEDULE_FIRED = "fired"  # how many workflows it started
SCHEDULE_SKIPPED = "skipped"  # fire times it started nothing for (overlap skip, missed)
