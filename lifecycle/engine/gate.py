"""The call of ``gate.lua`` that carries out what commits do under their concurrency keys.

A commit of a workflow under a key queues it (``Commit.enter``, with an offer of its
held start-tasks) or frees its place (``Commit.leave``); the gate admits whoever's turn
comes. The commits of one watched transaction share one call, a section each, so a
batch pays one script call (and one sending of its text) however many workflows it
starts or ends under keys; a commit through ``advance.lua`` has a call of its own,
which checks the version that commit wrote.

The script is sent with EVAL, not EVALSHA: it runs inside MULTI, where a NOSCRIPT
could not be retried (the commits' other writes would stand without it).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, lru_cache
from typing import Any

import hiredis
import orjson

from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.engine.commit import ADMITTED_FIELDS, Commit
from lifecycle.keys import Keys
from rqse import lua

__all__ = ["gate_command", "gate_packed", "gated"]

_SCRIPTS = lua.scripts_dir(__file__)
_EMPTY = b"$0\r\n\r\n"  # an empty bulk string


def gated(commits: Sequence[Commit]) -> list[Commit]:
    """The commits that do something under a concurrency key: one section each."""
    return [commit for commit in commits if commit.gate_key is not None]


def gate_command(commits: Sequence[Commit], check: bool = True) -> tuple[Any, ...] | None:
    """The EVAL of ``gate.lua`` that carries out, in order, what ``commits`` do under their
    keys, after their writes in the same transaction (None when none has a key). With
    ``check`` a section does nothing unless the version its commit writes stands (a
    script call that may lose its race); without, for a watched transaction, whose EXEC
    runs only when every commit won."""
    sections = gated(commits)
    if not sections:
        return None
    names = _key_names(sections)
    keys = sections[0].keys
    lifecycle, timers = sections[0].shared[0], sections[0].shared[1]
    pairs: list[str] = []
    for name in names:
        pairs += (keys.key_running(name), keys.key_queue(name))
    arguments: list[Any] = [*_header(len(names), len(sections))]
    for commit in sections:
        key, most = commit.gate_key  # type: ignore[misc]
        version = commit.written_version() if check else ""
        arguments += (names[key], most, commit.workflow, str(version), len(commit.gate) // 2)
        arguments += commit.gate
        if commit.offer is None:
            arguments.append(b"")
            continue
        assert commit.offer_admitted, "an offer names the value it admits with"
        events: list[Any] = []
        for stream, fields in commit.offered_events():
            events += (stream, len(fields) // 2, *fields)
        queued, held = commit.queued_fields()
        arguments += (commit.offer_admitted, queued, held, len(commit.offer), *events)
        arguments += (len(commit.offer_timers) // 2, *commit.offer_timers)
    hashes = [keys.workflow(commit.workflow) for commit in sections]
    all_keys = [lifecycle, timers, *pairs, *hashes]
    return ("EVAL", _body(), len(all_keys), *all_keys, *arguments)


def gate_packed(commits: Sequence[Commit], check: bool = True) -> bytes | None:
    """:func:`gate_command` packed for the wire, cheaper: the script's text packed once per
    process, the offered start-tasks spliced from their packed templates."""
    sections = gated(commits)
    if not sections:
        return None
    names = _key_names(sections)
    first = sections[0]
    keys, lifecycle, timers = first.keys, first.shared[0], first.shared[1]
    workflow_key = keys.workflow
    key_count = 2 + 2 * len(names) + len(sections)
    parts = [
        _pack(key_count, lifecycle, timers),
        *(_key_pair(keys, name) for name in names),
        _pack(*[workflow_key(commit.workflow) for commit in sections]),
        _pack(*_header(len(names), len(sections))),
    ]
    count = 3 + key_count + 7  # EVAL, text, numkeys; keys; the header
    append = parts.append
    for commit in sections:
        key, most = commit.gate_key  # type: ignore[misc]
        gate = commit.gate
        workflow = commit.workflow.encode()
        version = str(commit.written_version()).encode() if check else b""
        if len(gate) == 2:  # (one op, the common case: packed without hiredis)
            order = b"%d" % gate[1]
            append(
                b"%b$%d\r\n%b\r\n$%d\r\n%b\r\n$1\r\n1\r\n%b$%d\r\n%b\r\n"
                % (_section_key(names[key], most), len(workflow), workflow, len(version),
                   version, _OPS[gate[0]], len(order), order)
            )  # fmt: skip
        else:
            append(_pack(names[key], most, workflow, version, len(gate) // 2, *gate))
        count += 5 + len(gate)
        offer = commit.offer
        if offer is None:
            append(_EMPTY)
            count += 1
            continue
        admitted, m = commit.offer_admitted, b"%d" % len(offer)
        assert admitted, "an offer names the value it admits with ('' says no offer)"
        queued, held = commit.queued_fields()
        append(b"$%d\r\n%b\r\n" % (len(admitted), admitted))
        append(_pack(queued, held))
        append(b"$%d\r\n%b\r\n" % (len(m), m))
        count += 4
        for stream, values, template in offer:
            if template is None:
                append(_pack(stream, len(values) // 2 + 1, *values, *ADMITTED_FIELDS))
                count += 4 + len(values)
                continue
            fields = len(template.arguments) - 3  # after XADD <stream> *
            append(_stream_head(stream, fields // 2 + 1))
            append(template.fill(*values)[_xadd_head(stream, fields + 3) :])
            append(_ADMITTED_PACKED)
            count += 4 + fields
        timers_of = commit.offer_timers
        append(_pack(len(timers_of) // 2, *timers_of) if timers_of else _ZERO)
        count += 1 + len(timers_of)
    return b"*%d\r\n%b%b" % (count, _packed_text(), b"".join(parts))


def _key_names(sections: Sequence[Commit]) -> dict[str, int]:
    """Each concurrency key of ``sections`` and its number j in the call (from 1)."""
    names: dict[str, int] = {}
    for commit in sections:
        name = commit.gate_key[0]  # type: ignore[index]
        if name not in names:
            names[name] = len(names) + 1
    return names


def _header(keys: int, sections: int) -> tuple[Any, ...]:
    return (
        rec.VERSION, _ADMIT_JSON, ev.ADMIT_SENT, rec.CONCURRENCY, rec.PAUSED, keys, sections,
    )  # fmt: skip


_ADMIT_JSON = orjson.dumps(ev.ADMIT_WORKFLOW)


@cache
def _body() -> str:
    """gate.lua without comments and indentation, its lines kept where they are (an error
    names the file's line): sent with every EVAL, and hashed by Redis each time."""
    lines = (line.strip() for line in lua.script_source("gate", _SCRIPTS).splitlines())
    return "\n".join("" if line.startswith("--") else line for line in lines) + "\n"


def _pack(*arguments: Any) -> bytes:
    """``arguments`` packed as bulk strings, without the command's header."""
    packed: bytes = hiredis.pack_command(arguments)
    return packed[packed.index(b"\n") + 1 :]


_ADMITTED_PACKED = _pack(*ADMITTED_FIELDS)
_ZERO = _pack(0)
_OPS = {op: _pack(op) for op in ("enter", "leave")}


@lru_cache(maxsize=1024)
def _section_key(j: int, most: int) -> bytes:
    """A section's key number and max running, packed."""
    return _pack(j, most)


@lru_cache(maxsize=1024)
def _stream_head(stream: str, pairs: int) -> bytes:
    """An offered start-task's stream and number of fields, packed."""
    return _pack(stream, pairs)


@lru_cache(maxsize=1024)  # bounded: concurrency keys are the submitters' to name
def _key_pair(keys: Keys, name: str) -> bytes:
    """The running set and the line of the key ``name``, packed."""
    return _pack(keys.key_running(name), keys.key_queue(name))


@cache
def _xadd_head(stream: str, arguments: int) -> int:
    """How many bytes of a packed ``XADD stream * ...`` of ``arguments`` arguments come
    before its fields."""
    return len(b"*%d\r\n" % arguments) + len(_pack("XADD", stream, "*"))


@cache
def _packed_text() -> bytes:
    """``EVAL`` and gate.lua's text as packed in a command (RESP bulk strings)."""
    body = _body().encode()
    return b"$4\r\nEVAL\r\n$%d\r\n%b\r\n" % (len(body), body)
