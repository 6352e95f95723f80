"""Events and their wire format (see ``docs/events.md``, "Wire format").

An event is a dict with string keys. On the wire it is one stream entry: each
top-level key becomes a field name (UTF-8) and each value is stored as its own
JSON text. rqse 0.5 wrote the same shape with ``json.dumps``; we write with
orjson (compact, UTF-8) and read both, including the ``NaN``/``Infinity``
tokens the standard library emits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from rqse.errors import EventEncodingError, MalformedEntry

__all__ = [
    "ACTION",
    "API_VERSION",
    "AT",
    "FOR",
    "KIND",
    "RECEIPT",
    "TARGET",
    "Fields",
    "decode_fields",
    "decode_lenient",
    "encode_event",
    "message",
    "raw_stream_items",
    "receipt_for",
    "stream_items",
    "utc_timestamp",
]

# Field names with a meaning to rqse.
KIND = "kind"
API_VERSION = "apiVersion"
AT = "at"
FOR = "for"
ACTION = "action"
TARGET = "target"
RECEIPT = "receipt"  # the kind of receipt events

# Encoded fields, field name -> JSON bytes. Typed loosely because redis-py's
# annotations use invariant dicts of unions that no concrete dict matches.
Fields = dict[Any, Any]

_DUMPS_OPTIONS = orjson.OPT_NON_STR_KEYS  # {1: x} -> {"1": x}, as json.dumps does
_dumps = orjson.dumps
_loads = orjson.loads
_DIGITS_AS_ZEROS = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19  # digits of an integer that may not fit 64 bits: -9223372036854775809


def has_long_digits(data: bytes) -> bool:
    """Whether ``data`` holds 19 digits in a row: an integer there may not fit 64 bits,
    and orjson reads such an integer as a float, losing digits. (A translation and a
    substring search: twenty times faster than a regular expression.)"""
    return _LONG_RUN in data.translate(_DIGITS_AS_ZEROS)


# Field names already decoded: an application uses a few dozen, and a dict lookup costs
# a third of decoding the bytes again for every field of every entry. Bounded in count
# and in name length (about 1 MB at most), and started afresh when full, so garbage on
# a stream costs only the lookups.
_NAMES: dict[bytes, str] = {}
_MAX_NAMES = 4096
_MAX_NAME_BYTES = 64


def utc_timestamp(at: datetime | str | None = None) -> str:
    """ISO-8601 text in UTC, shaped like rqse 0.5's ``2024-05-01T12:00:00.123456+00:00``.

    A naive datetime is taken to be UTC already; a string is kept as given.
    """
    if isinstance(at, str):
        return at
    if at is None:
        at = datetime.now(UTC)
    elif at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    else:
        at = at.astimezone(UTC)
    return at.isoformat()


def message(
    data: Mapping[str, Any] | None = None,
    kind: str | None = None,
    api_version: str = "v1",
    at: datetime | str | None = None,
    response_for: str | None = None,
) -> dict[str, Any]:
    """A new event: ``data`` plus ``kind``, ``apiVersion``, ``at`` and ``for``.

    Keys already in ``data`` win, as in rqse 0.5; unlike 0.5, ``data`` itself is
    not modified (a copy is returned).
    """
    event = dict(data) if data else {}
    if kind is not None:
        event.setdefault(KIND, kind)
    event.setdefault(API_VERSION, api_version)
    if AT not in event:
        event[AT] = utc_timestamp(at)
    if response_for is not None:
        event.setdefault(FOR, response_for)
    return event


def receipt_for(id: str, action: str = "processed", target: Any = None) -> dict[str, Any]:
    """A ``receipt`` event saying that entry ``id`` was ``action`` (by ``target``)."""
    data: dict[str, Any] = {FOR: id, ACTION: action}
    if target is not None:
        data[TARGET] = target
    return message(data, kind=RECEIPT)


def encode_event(event: Mapping[str, Any]) -> Fields:
    """Stream fields of ``event``: one JSON text per top-level key."""
    try:
        fields = {name: _dumps(value, option=_DUMPS_OPTIONS) for name, value in event.items()}
    except (TypeError, AttributeError):  # orjson.JSONEncodeError is a TypeError
        pass
    else:
        if not fields:
            raise EventEncodingError("an event needs at least one field (entries cannot be empty)")
        return fields
    # Slow path, only to say which field is wrong.
    if not isinstance(event, Mapping):
        raise EventEncodingError(f"an event must be a mapping, got {type(event).__name__}")
    fields = {}
    for name, value in event.items():
        if not isinstance(name, str):
            raise EventEncodingError(f"field name {name!r} is not a string")
        try:
            fields[name] = _dumps(value, option=_DUMPS_OPTIONS)
        except (TypeError, orjson.JSONEncodeError) as e:
            raise EventEncodingError(f"field {name!r}: value {value!r:.80} is not JSON: {e}") from e
    return fields


def _load_value(raw: bytes, name: str, entry_id: str | None) -> Any:
    if not has_long_digits(raw):
        try:
            return _loads(raw)
        except orjson.JSONDecodeError:
            pass
    # json.dumps output orjson refuses (NaN, Infinity, lone surrogates), and integers
    # past 64 bits, which orjson would round to a float: the standard parser keeps them.
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:  # deeper than orjson's 1024 levels: garbage, not an event
        raise MalformedEntry(
            "invalid-json",
            f"field {name!r} is nested too deeply ({len(raw)} bytes)",
            entry_id=entry_id,
            field=name,
        ) from None
    except (UnicodeDecodeError, ValueError) as e:
        preview = raw[:60].decode("utf-8", "replace")
        raise MalformedEntry(
            "invalid-json",
            f"field {name!r} is not JSON: {preview!r} ({e})",
            entry_id=entry_id,
            field=name,
        ) from None


def decode_fields(
    fields: Mapping[bytes, bytes],
    entry_id: str | None = None,
    kind_field: str | None = KIND,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """The event stored in ``fields``; raises :class:`MalformedEntry`.

    Checks, in order: total size of names and values against ``max_bytes``
    (``oversize``), every value is JSON (``invalid-json``), and, unless
    ``kind_field`` is None, that field is present and a string (``invalid-kind``).
    """
    values = b"".join(fields.values())  # one pass serves the size and the digits
    if max_bytes is not None:
        size = len(values) + len(b"".join(fields))  # a join costs less than len() each
        if size > max_bytes:
            raise MalformedEntry(
                "oversize", f"entry is {size} bytes (limit {max_bytes})", entry_id=entry_id
            )
    try:
        if has_long_digits(values):
            raise _MayRound  # read per field below, integers exact
        known = _NAMES.get
        event = {known(name) or _field_name(name): _loads(raw) for name, raw in fields.items()}
    except (orjson.JSONDecodeError, UnicodeDecodeError, _MayRound):
        event = {}
        for name, raw in fields.items():
            try:
                text = name.decode()
            except UnicodeDecodeError:
                raise MalformedEntry(
                    "invalid-json", f"field name {name[:40]!r} is not UTF-8", entry_id=entry_id
                ) from None
            event[text] = _load_value(raw, text, entry_id)
    if kind_field is not None and not isinstance(event.get(kind_field), str):
        if kind_field in event:
            detail = f"field {kind_field!r} is {event[kind_field]!r}, expected a string"
        else:
            detail = f"no {kind_field!r} field (fields: {', '.join(sorted(event))})"
        raise MalformedEntry("invalid-kind", detail, entry_id=entry_id, field=kind_field)
    return event


class _MayRound(Exception):
    """An entry whose values orjson may read with an integer rounded to a float."""


def _field_name(name: bytes) -> str:
    text = name.decode()
    if len(name) <= _MAX_NAME_BYTES:
        if len(_NAMES) >= _MAX_NAMES:
            _NAMES.clear()
        _NAMES[name] = text
    return text


def decode_lenient(fields: Mapping[bytes, bytes]) -> dict[str, Any]:
    """Decode what can be decoded; a value that is not JSON is kept as text."""
    event: dict[str, Any] = {}
    for name, raw in fields.items():
        text = name.decode("utf-8", "replace")
        try:
            event[text] = _load_value(raw, text, None)
        except MalformedEntry:
            event[text] = raw.decode("utf-8", "replace")
    return event


def stream_items(reply: Any) -> Iterable[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]:
    """``(stream, entries)`` pairs of an XREAD/XREADGROUP reply, RESP2 or RESP3."""
    if not reply:
        return ()
    if isinstance(reply, dict):  # RESP3: {stream: [entries]}
        return ((name, value[0] if value else []) for name, value in reply.items())
    return reply  # type: ignore[no-any-return]


def raw_stream_items(reply: Any) -> list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]:
    """``(stream, [(entry id, {name: value})])`` of an XREAD/XREADGROUP reply as the
    parser returns it (no redis-py callback; RESP2 or RESP3). An entry deleted while
    pending has no fields: ``{}``."""
    if not reply:
        return []
    streams = reply.items() if isinstance(reply, dict) else reply
    items = []
    for name, raw_entries in streams:
        entries: list[tuple[bytes, dict[bytes, bytes]]] = []
        append = entries.append
        for entry_id, flat in raw_entries:
            pairs = iter(flat or ())
            # name, value, ...: zip() called with a keyword (strict=) leaves CPython's fast
            # call path, a quarter of this loop's cost per entry; Redis gives pairs.
            append((entry_id, dict(zip(pairs, pairs))))  # noqa: B905
        items.append((name, entries))
    return items
