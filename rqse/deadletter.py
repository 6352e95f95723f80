"""Dead letters: entries a listener gave up on, kept with the reason.

A dead letter is itself an event in the wire format, appended to
:func:`rqse.keys.dead_letter_key` of the stream the entry came from, in the same
transaction that acknowledges the original. Read them back with
``EventClient(dead_letter_key(stream)).range(count=None)``. Fields:

``kind``         ``"dead-letter"``
``stream``       the stream the entry was read from
``group``        the consumer group that gave up on it
``consumer``     the consumer that moved it
``id``           the original entry id (the original stays in its stream until trimmed)
``reason``       one of :data:`REASONS`
``error``        the error text (exception type and message, or the decoding problem)
``traceback``    the formatted traceback for ``process-error`` (capped)
``deliveries``   times the group delivered the entry
``fields``       the original fields as text, name -> raw value (absent for ``oversize``)
``size``         the original entry's size in bytes
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rqse.events import Fields, encode_event, message

__all__ = [
    "DEAD_LETTER",
    "INVALID_JSON",
    "INVALID_KIND",
    "MAX_DELIVERIES",
    "OVERSIZE",
    "PROCESS_ERROR",
    "REASONS",
    "REJECTED",
    "UNSELECTED",
    "dead_letter_fields",
]

DEAD_LETTER = "dead-letter"  # kind of dead-letter events

PROCESS_ERROR = "process-error"  # process() raised on the last allowed delivery
MAX_DELIVERIES = "max-deliveries"  # delivered too often without an acknowledgement
INVALID_JSON = "invalid-json"  # a field name is not UTF-8 or a value is not JSON
INVALID_KIND = "invalid-kind"  # no kind field, or not a string
OVERSIZE = "oversize"  # larger than the listener's max_entry_bytes
REJECTED = "rejected"  # process_batch() refused it (e.g. a field of the wrong type)
UNSELECTED = "unselected"  # a kind outside select, on a stream only selected kinds belong on
REASONS = (
    PROCESS_ERROR,
    MAX_DELIVERIES,
    INVALID_JSON,
    INVALID_KIND,
    OVERSIZE,
    REJECTED,
    UNSELECTED,
)

TRACEBACK_LIMIT = 8_000  # characters of traceback kept in a dead letter


def dead_letter_fields(
    *,
    stream: str,
    group: str,
    consumer: str,
    entry_id: str,
    fields: Mapping[bytes, bytes],
    reason: str,
    error: str,
    deliveries: int,
    traceback: str | None = None,
) -> Fields:
    """Encoded fields of the dead letter for one entry."""
    size = sum(map(len, fields)) + sum(map(len, fields.values()))
    data: dict[str, Any] = {
        "stream": stream,
        "group": group,
        "consumer": consumer,
        "id": entry_id,
        "reason": reason,
        "error": error,
        "deliveries": deliveries,
        "size": size,
    }
    if traceback:
        data["traceback"] = traceback[-TRACEBACK_LIMIT:]
    if reason != OVERSIZE:
        data["fields"] = {
            name.decode("utf-8", "replace"): value.decode("utf-8", "replace")
            for name, value in fields.items()
        }
    return encode_event(message(data, kind=DEAD_LETTER))
