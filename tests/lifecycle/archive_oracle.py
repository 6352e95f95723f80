"""What an archived entry must read back as, decided independently of the worker's code:
the standard library's JSON parser (exact integers, NaN) stands in for orjson's."""

from __future__ import annotations

import json
from typing import Any

import orjson

MAX_DEPTH = 252  # what a line holds under its record and event (orjson writes 254 levels)


class _Refused(Exception):
    pass


def _int(text: str) -> int:
    number = int(text)
    if not -(2**63) <= number < 2**64:
        raise _Refused
    return number


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def expected_fields(fields: list[bytes]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """``(event, raw)``: the decoded fields, and the exact bytes of those kept raw."""
    event: dict[str, Any] = {}
    raw: dict[str, bytes] = {}
    for name, value in zip(fields[0::2], fields[1::2], strict=True):
        try:
            text = name.decode()
        except UnicodeDecodeError:
            raw[name.decode("utf-8", "backslashreplace")] = value
            continue
        try:
            decoded = json.loads(value.decode("utf-8"), parse_int=_int)
            if _depth(decoded) > MAX_DEPTH:
                raise _Refused
            decoded = orjson.loads(orjson.dumps(decoded))  # NaN -> null; lone surrogates fail
        except (_Refused, ValueError, RecursionError, orjson.JSONEncodeError):
            event.pop(text, None)
            raw[text] = value
            continue
        raw.pop(text, None)
        event[text] = decoded
    return event, raw
