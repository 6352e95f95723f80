"""A workflow's state as fields of its hash: one JSON document, or chunked entry by entry.

A :class:`~flowlang.state.State` is stored whole in :data:`records.STATE`. A
:class:`~flowlang.state.ChunkedState` (a flow with an iteration, or a wide one)
stores there only its core — status, output, error, the running count ``live``,
which marks it chunked — and each entry of its tables in a field of its own:

========================  ==============================================
``r:<key>``               a running task instance: its attempt
``f:<key>``               an open iteration: ``[items left, items]``
``i:<key>/<index>``       the output collected from one of its items
``w:<key>``               arrivals so far at a join
``a:<key>/<n>``           the n-th arrival: ``[predecessor, value]``
``q:<key>/<n>``           the n-th chunk of its items waiting to start
========================  ==============================================

The lifecycle loads the core and the entries a batch touches
(:func:`partial_state`), and writes back only what changed (:func:`write_changes`).
Readers that show a workflow load it whole (:func:`state_from_fields`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from flowlang.limits import DEFAULT_LIMITS
from flowlang.state import (
    ARRIVAL,
    FANIN,
    OUTPUT,
    QUEUED,
    RUNNING_TABLE,
    WAITING,
    ChunkedState,
    Entry,
    State,
)
from lifecycle import records as rec

__all__ = [
    "CHUNKED",
    "entry_field",
    "is_chunked",
    "partial_state",
    "state_from_fields",
    "whole_state",
    "write_changes",
]

CHUNKED = "live"  # the core's key that marks a chunked state (its running count)
_PREFIX = {
    RUNNING_TABLE: rec.RUNNING_PREFIX,
    FANIN: rec.FANIN_PREFIX,
    WAITING: rec.WAITING_PREFIX,
    OUTPUT: rec.OUTPUT_PREFIX,
    ARRIVAL: rec.ARRIVAL_PREFIX,
    QUEUED: rec.QUEUED_PREFIX,
}
_loads, _dumps = orjson.loads, orjson.dumps
# An iteration recorded with more items is corrupt: what readers accept (the lifecycle
# checks against its own --max-items).
_MAX_ITEMS = max(DEFAULT_LIMITS.items, 10_000_000)


def is_chunked(core: Mapping[str, Any]) -> bool:
    return CHUNKED in core


def entry_field(entry: Entry) -> str:
    """The hash field that stores ``entry`` (as :class:`flowlang.state.Missing` names it)."""
    if len(entry) == 2:
        return _PREFIX[entry[0]] + entry[1]
    return f"{_PREFIX[entry[0]]}{entry[1]}/{entry[2]}"  # type: ignore[misc]


def partial_state(
    core: dict[str, Any], loaded: Iterable[tuple[str, Any]], max_items: int = _MAX_ITEMS
) -> ChunkedState:
    """A chunked state from its ``core`` and the entry fields loaded for a transition:
    (field name, stored value or None); a None says the entry is not stored. A value no
    run writes raises ValueError naming its field (``max_items``: the most items an
    iteration may have)."""
    state = ChunkedState(_checked_core(core), partial=True)
    for name, value in loaded:
        _place(state, name, value, max_items)
    return state


def whole_state(
    core: dict[str, Any], fields: Mapping[Any, Any], max_items: int = _MAX_ITEMS
) -> ChunkedState:
    """A chunked state from its ``core`` and every field of its hash (checked as by
    :func:`partial_state`)."""
    state = ChunkedState(_checked_core(core))
    for name, value in fields.items():
        text = name.decode() if isinstance(name, bytes) else str(name)
        if text[:2] in _ENTRY_PREFIXES:
            _place(state, text, value, max_items)
    for table in state.tables():  # the counts follow what is stored
        table.size = dict.__len__(table)
    return state


_ENTRY_PREFIXES = frozenset(_PREFIX.values())


def _checked_core(core: dict[str, Any]) -> dict[str, Any]:
    live = core.get(CHUNKED)
    if type(live) is not int or live < 0:
        raise ValueError(f"field {rec.STATE}: running count {live!r} is not a count")
    return core


def _place(state: ChunkedState, name: str, value: Any, max_items: int) -> None:
    prefix, rest = name[:2], name[2:]
    try:
        if prefix == rec.RUNNING_PREFIX:
            _table_entry(state.running, rest, value, _attempt)
        elif prefix == rec.FANIN_PREFIX:
            _table_entry(state.fanin, rest, value, lambda v: _iteration(v, max_items))
        elif prefix == rec.WAITING_PREFIX:
            _table_entry(state.waiting, rest, value, _attempt)
        elif value is not None:
            key, _, index = rest.rpartition("/")
            number = int(index)
            if number < 0 or not key:
                raise ValueError(f"{index!r} is not an index of an entry")
            entry = _loads(value)
            if prefix != rec.OUTPUT_PREFIX and type(entry) is not list:
                raise ValueError("not a list")
            _ENTRIES[prefix](state).setdefault(key, {})[number] = entry
    except (ValueError, TypeError) as error:  # orjson's errors are ValueErrors
        raise ValueError(f"field {name}: {error}") from None


def _attempt(value: Any) -> bool:
    return type(value) is int and value >= 1


def _iteration(value: Any, max_items: int) -> bool:
    """[items left, items] or [items left, items, next item, first queued item]."""
    if type(value) is not list or len(value) not in (2, 4):
        return False
    if any(type(n) is not int for n in value):
        return False
    left, items = value[0], value[1]
    if not 1 <= left <= items <= max_items:
        return False
    return len(value) == 2 or 0 <= value[3] <= value[2] <= items


_ENTRIES = {  # the entries of a chunked state stored one field per index
    rec.OUTPUT_PREFIX: lambda state: state.outputs,
    rec.ARRIVAL_PREFIX: lambda state: state.arrivals,
    rec.QUEUED_PREFIX: lambda state: state.queued,
}


def _table_entry(table: Any, key: str, value: Any, valid: Callable[[Any], bool]) -> None:
    if value is None:
        table.absent.add(key)
        return
    entry = _loads(value)
    if not valid(entry):
        raise ValueError(f"{entry!r} is no value this field holds")
    dict.__setitem__(table, key, entry)


def write_changes(state: ChunkedState, fields: list[Any], removed: list[str]) -> None:
    """Append what the last transition changed in ``state``'s entries to ``fields``
    (name, value, ...) and ``removed`` (names), and start recording afresh."""
    prefixes = (rec.RUNNING_PREFIX, rec.FANIN_PREFIX, rec.WAITING_PREFIX)
    for table, prefix in zip(state.tables(), prefixes, strict=True):
        for key in table.changed:
            fields += (prefix + key, _dumps(dict.__getitem__(table, key)))
        removed += [prefix + key for key in table.dropped]
    for entries, changed, dropped, prefix in (
        (state.outputs, state.changed_outputs, state.dropped_outputs, rec.OUTPUT_PREFIX),
        (state.arrivals, state.changed_arrivals, state.dropped_arrivals, rec.ARRIVAL_PREFIX),
    ):
        for key, index in changed:
            fields += (f"{prefix}{key}/{index}", _dumps(entries[key][index]))
        for key, count in dropped:
            removed += [f"{prefix}{key}/{n}" for n in range(count)]
    queued = state.queued
    for key, chunk in state.changed_queued:
        fields += (f"{rec.QUEUED_PREFIX}{key}/{chunk}", _dumps(queued[key][chunk]))
    removed += [f"{rec.QUEUED_PREFIX}{key}/{chunk}" for key, chunk in state.dropped_queued]
    state.saved()


def state_from_fields(fields: Mapping[Any, Any]) -> State:
    """The whole state stored in a workflow's hash fields (names and values as bytes or
    str): what readers show. An empty state when it has none."""
    raw = fields.get(rec.STATE)
    if raw is None:
        raw = fields.get(rec.STATE.encode())
    core = _loads(raw) if raw else {}
    if is_chunked(core):
        return whole_state(core, fields)
    return State.from_dict(core)
