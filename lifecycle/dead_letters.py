"""Dead letters of the engine's streams: list, show, requeue once, purge.

Every engine stream (the lifecycle stream and each task kind's) has its dead
letters in ``<stream>:dead`` (:mod:`rqse.deadletter` describes an entry: the
original stream and id, the reason, the error, the original fields). A dead
letter is named by its own entry id in that stream; a *source* says which
stream: ``lifecycle`` for the lifecycle stream, the kind for a task stream
(``ml``, or ``tasks:ml`` — the form to use for a task kind that is itself
named ``lifecycle``).

Requeue appends the original fields to the original stream as a new entry and
deletes the dead letter in one Lua script (``scripts/requeue_dead_letter.lua``),
so a dead letter is delivered again at most once however often it is requeued.
Purge removes the dead letters that were there when it looked (XTRIM MINID), not
one that arrives meanwhile. The receipts worker archives dead-letter streams but
never trims them: only purge (or requeue) removes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import redis

from lifecycle.audit.archive import id_order
from lifecycle.errors import LifecycleError
from lifecycle.inspect import iso
from lifecycle.keys import Keys
from lifecycle.priorities import task_streams
from rqse import lua
from rqse.client import scan_entries
from rqse.keys import DEAD_LETTER_SUFFIX, dead_letter_key

__all__ = [
    "LIFECYCLE_SOURCE",
    "DeadLetter",
    "DeadLetterError",
    "Requeued",
    "UnknownDeadLetter",
    "dead_letter_count",
    "find_dead_letter",
    "list_dead_letters",
    "purge",
    "requeue",
    "sources",
]

LIFECYCLE_SOURCE = "lifecycle"  # the source name of the lifecycle stream's dead letters
_TASKS = "tasks:"
_SCRIPTS = lua.scripts_dir(__file__)
_PAGE = 1000  # dead letters read per round trip


class DeadLetterError(LifecycleError):
    """Raised when a dead letter cannot be acted on as asked (no original fields to
    requeue, an unknown source, an id found in several sources): exit 2."""


class UnknownDeadLetter(DeadLetterError):
    """Raised when no dead-letter stream holds the id asked for: exit 2."""


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter as read, every field optional but ``id`` and ``source``: an
    entry that is not what rqse writes is shown with what could be read."""

    id: str  # the dead letter's own entry id in its dead-letter stream
    source: str  # "lifecycle" or a task kind
    dead_stream: str
    stream: str | None  # the original stream
    original_id: str | None
    reason: str | None
    error: str | None
    group: str | None
    consumer: str | None
    deliveries: int | None
    size: int | None
    traceback: str | None
    fields: dict[str, str] | None  # the original entry, name -> raw value (None: oversize)

    @property
    def at(self) -> str | None:
        """When it was dead-lettered (its id's time)."""
        return iso(id_order(self.id)[0])

    @property
    def event(self) -> dict[str, Any]:
        """The original event's fields that say what it was: kind, workflow, key, name,
        attempt (those that are there and are JSON)."""
        found: dict[str, Any] = {}
        for name in ("kind", "workflow", "key", "name", "attempt"):
            raw = (self.fields or {}).get(name)
            if raw is None:
                continue
            try:
                found[name] = orjson.loads(raw)
            except orjson.JSONDecodeError:
                found[name] = raw
        return found

    def summary(self) -> dict[str, Any]:
        """Plain data for ``--json``: every field, and ``at`` and ``event``."""
        return {
            "id": self.id,
            "source": self.source,
            "at": self.at,
            "stream": self.stream,
            "original_id": self.original_id,
            "reason": self.reason,
            "error": self.error,
            "event": self.event,
            "group": self.group,
            "consumer": self.consumer,
            "deliveries": self.deliveries,
            "size": self.size,
            "traceback": self.traceback,
            "fields": self.fields,
            "dead_stream": self.dead_stream,
        }


@dataclass(frozen=True)
class Requeued:
    """What requeue did with one id: ``new_id`` in ``stream``, or None when the dead
    letter was no longer there (requeued or purged meanwhile)."""

    id: str
    source: str
    stream: str
    new_id: str | None


def sources(client: redis.Redis, keys: Keys, kind: str | None = None) -> list[tuple[str, str]]:
    """(source, original stream) pairs: the lifecycle stream and every task kind's, or
    the one ``kind`` names (:class:`DeadLetterError` when it names none)."""
    found = task_streams(client, keys)
    every = [(LIFECYCLE_SOURCE, keys.lifecycle)] + [(t.source, t.stream) for t in found]
    if kind is None:
        return every
    if kind == LIFECYCLE_SOURCE:
        return every[:1]
    name = kind.removeprefix(_TASKS)
    named = [pair for pair in every[1:] if pair[0] == name]
    if named:
        return named
    known = ", ".join(source for source, _ in every)
    raise DeadLetterError(f"no stream of kind {kind!r} (known: {known})")


def dead_letter_count(client: redis.Redis, stream: str) -> int:
    """How many dead letters ``stream`` has (XLEN of its dead-letter stream)."""
    try:
        return int(client.xlen(dead_letter_key(stream)))  # type: ignore[arg-type]
    except redis.ResponseError:  # not a stream: nothing rqse wrote
        return 0


def list_dead_letters(
    client: redis.Redis, keys: Keys, kind: str | None = None, limit: int | None = None
) -> list[DeadLetter]:
    """The dead letters of every source (or ``kind``'s), oldest first within a source,
    at most ``limit`` in all (None or 0: all)."""
    found: list[DeadLetter] = []
    for source, stream in sources(client, keys, kind):
        for entry_id, fields in scan_entries(client, dead_letter_key(stream), _PAGE):
            found.append(_parse(source, dead_letter_key(stream), entry_id, fields))
            if limit and len(found) >= limit:
                return found
    return found


def find_dead_letter(
    client: redis.Redis, keys: Keys, dead_id: str, kind: str | None = None
) -> DeadLetter:
    """The dead letter with entry id ``dead_id`` (in ``kind``'s dead letters, or any).
    :class:`UnknownDeadLetter` when none has it; :class:`DeadLetterError` when several
    sources have an entry of that id (ids are per stream): ``kind`` tells them apart."""
    _check_id(dead_id)
    found = []
    for source, stream in sources(client, keys, kind):
        dead = dead_letter_key(stream)
        rows: Any = client.xrange(dead, dead_id, dead_id)
        found += [_parse(source, dead, raw_id, fields) for raw_id, fields in rows]
    if not found:
        where = f"of kind {kind!r}" if kind else "in any dead-letter stream"
        raise UnknownDeadLetter(f"no dead letter {dead_id!r} {where}")
    if len(found) > 1:
        names = ", ".join(letter.source for letter in found)
        raise DeadLetterError(f"dead letter {dead_id!r} is in several: {names} (add --kind)")
    return found[0]


def requeue(client: redis.Redis, letter: DeadLetter) -> Requeued:
    """Append the dead letter's original entry to its original stream as a new entry
    and delete the dead letter, atomically; once only (see the module)."""
    original = letter.dead_stream.removesuffix(DEAD_LETTER_SUFFIX)
    if letter.stream != original:
        raise DeadLetterError(
            f"dead letter {letter.id} names stream {letter.stream!r}, expected {original!r} "
            "(not written by rqse): not requeued"
        )
    if not letter.fields:
        why = letter.reason if letter.reason else "no reason"
        raise DeadLetterError(
            f"dead letter {letter.id} keeps no fields of its entry ({why}): nothing to requeue"
        )
    args: list[str] = [letter.id]
    for name, value in letter.fields.items():
        args += [name, value]
    script = lua.load_script(client, "requeue_dead_letter", _SCRIPTS)
    new_id = script(keys=[letter.dead_stream, original], args=args)
    if isinstance(new_id, bytes):
        new_id = new_id.decode()
    return Requeued(letter.id, letter.source, original, new_id)


def purge(client: redis.Redis, keys: Keys, kind: str | None = None) -> dict[str, int]:
    """Delete the dead letters there now, per source (or ``kind``'s); returns how many
    each lost. Ones that arrive while it runs stay (XTRIM MINID past the last seen)."""
    removed = {}
    for source, stream in sources(client, keys, kind):
        dead = dead_letter_key(stream)
        last: Any = client.xrevrange(dead, "+", "-", count=1)
        if not last:
            continue
        ms, seq = id_order(last[0][0].decode())
        count = client.xtrim(dead, minid=f"{ms}-{seq + 1}", approximate=False)
        removed[source] = int(count)  # type: ignore[arg-type]
    return removed


def _check_id(entry_id: str) -> None:
    ms, _, seq = entry_id.partition("-")
    if not (ms.isdigit() and seq.isdigit()):
        raise DeadLetterError(f"{entry_id!r} is not a stream entry id (like 1700000000000-0)")


def _parse(source: str, dead: str, raw_id: bytes, raw: dict[bytes, bytes]) -> DeadLetter:
    values: dict[str, Any] = {}
    for name, value in raw.items():
        try:
            values[name.decode("utf-8", "replace")] = orjson.loads(value)
        except orjson.JSONDecodeError:
            values[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")

    def text(name: str) -> str | None:
        value = values.get(name)
        return value if isinstance(value, str) else None

    def number(name: str) -> int | None:
        value = values.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    fields = values.get("fields")
    if not (isinstance(fields, dict) and all(isinstance(v, str) for v in fields.values())):
        fields = None
    return DeadLetter(
        id=raw_id.decode(),
        source=source,
        dead_stream=dead,
        stream=text("stream"),
        original_id=text("id"),
        reason=text("reason"),
        error=text("error"),
        group=text("group"),
        consumer=text("consumer"),
        deliveries=number("deliveries"),
        size=number("size"),
        traceback=text("traceback"),
        fields=fields,
    )
