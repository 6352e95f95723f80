"""A chunked state loaded entry by entry gives the same run as a whole state.

No Redis here: a dict stands for the workflow's hash, and each event is applied
as the lifecycle applies it — the core and the entries its key touches are
loaded, a transition that finds an entry missing is run again with it loaded,
and only what changed is written back. Items end in a random order, in batches
of random sizes, so every entry is loaded, missed and written in every order.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowlang.compiler import compile_text
from flowlang.limits import Limits
from flowlang.machine import ChunkedState, Finished, Machine, Missing, StartTask, State
from flowlang.runner import run
from lifecycle import records as rec
from lifecycle.stored_state import (
    entry_field,
    is_chunked,
    partial_state,
    state_from_fields,
    write_changes,
)

FLOWS = [
    "A → * B → C",
    "A → * { B → C } → D",
    "A → * { B → * C } → D",  # nested: each B outputs a list
    "A → * { B → ? `$[?(@.keep=true)]` C } → D",  # a guard skips some items
    " | ".join(f"T{n}" for n in range(70)) + " → J",  # a 70-way join: chunked by width
    "A → * B → * C → D",
]


def task(call: Any) -> Any:
    """Deterministic outputs: lists where the next step iterates, else a tagged value."""
    value = call.input
    if call.name in ("A", "B") and not isinstance(value, list):
        n = value.get("n", 3) if isinstance(value, dict) else 3
        return [{"n": (n + i) % 4, "keep": i % 2 == 0} for i in range(n)]
    if call.name == "A":
        return [{"n": i % 4, "keep": i % 3 == 0} for i in range(len(value))]
    return {"by": call.name, "of": value}


def whole(fields: dict[str, bytes]) -> ChunkedState:
    state = state_from_fields(fields)
    assert isinstance(state, ChunkedState)
    return state


class Store:
    """A workflow's hash as a dict, and the lifecycle's way of applying one batch."""

    def __init__(self, state: ChunkedState) -> None:
        self.fields: dict[str, bytes] = {}
        self.save(state)

    def save(self, state: ChunkedState) -> None:
        fields: list[Any] = []
        removed: list[str] = []
        write_changes(state, fields, removed)
        for name, value in zip(fields[::2], fields[1::2], strict=True):
            self.fields[name] = value
        for name in removed:
            self.fields.pop(name, None)
        self.fields[rec.STATE] = orjson.dumps(state.to_dict())

    def load(self, wanted: list[str]) -> ChunkedState:
        core = orjson.loads(self.fields[rec.STATE])
        return partial_state(core, [(name, self.fields.get(name)) for name in wanted])

    def apply(self, machine: Machine, batch: list[tuple[StartTask, Any]]) -> list[Any]:
        """End every task of ``batch``; returns the actions. After 4 loads that each
        found more missing, the whole state (as the advance does)."""
        wanted = [rec.RUNNING_PREFIX + start.key for start, _ in batch]
        wanted += [rec.FANIN_PREFIX + s.key.rpartition(".")[0] for s, _ in batch if "." in s.key]
        for loads in range(5):
            state = self.load(wanted) if loads < 4 else whole(self.fields)
            try:
                actions = []
                for start, output in batch:
                    actions += machine.task_ended(state, start.key, start.attempt, output)
            except Missing as missing:
                assert missing.wanted is not None  # no event here needs the whole state
                wanted += [entry_field(entry) for entry in missing.wanted]
                continue
            self.save(state)
            return actions
        raise AssertionError("a whole state found entries missing")


def run_chunked(
    text: str, input: Any, seed: int, window: int, whole_for: int = 0
) -> tuple[str, Any, Store]:
    """Run ``text`` with its state chunked from the start, or kept whole for the first
    ``whole_for`` batches and then chunked (ChunkedState.of), as the lifecycle does once
    a state grows large."""
    graph = compile_text(text)
    machine = Machine(graph, Limits(window=window))
    whole: State | None = State() if whole_for else None
    state = whole or ChunkedState()
    waiting = [a for a in machine.start(state, input) if isinstance(a, StartTask)]
    store = Store(state) if whole is None else None
    rng = random.Random(seed)
    result: tuple[str, Any] = ("running", None)
    batches = 0
    while waiting:
        rng.shuffle(waiting)
        size = rng.randint(1, max(1, len(waiting)))
        batch, waiting = waiting[:size], waiting[size:]
        calls = [(s, task(_Call(s.name, s.input))) for s in batch]
        if whole is not None:
            actions = [a for s, out in calls for a in machine.task_ended(whole, s.key, 1, out)]
            batches += 1
            if batches == whole_for and whole.status == "running":
                chunked = ChunkedState.of(whole)
                assert chunked is not None
                store, whole = Store(chunked), None
        else:
            assert store is not None
            actions = store.apply(machine, calls)
        for action in actions:
            if isinstance(action, StartTask):
                waiting.append(action)
            elif isinstance(action, Finished):
                result = ("finished", action.output)
    if store is None:  # it ended before it was chunked
        assert whole is not None
        store = Store(ChunkedState.of(whole) or ChunkedState())
    return result[0], result[1], store


class _Call:
    def __init__(self, name: str, input: Any) -> None:
        self.name, self.input = name, input


@settings(max_examples=80, deadline=None)
@given(
    flow=st.sampled_from(FLOWS),
    items=st.integers(0, 12),
    seed=st.integers(0, 2**16),
    window=st.sampled_from([1, 2, 5, 10_000]),
    whole_for=st.integers(0, 3),
)
def test_a_chunked_state_loaded_by_entry_runs_as_the_whole_state_does(
    flow: str, items: int, seed: int, window: int, whole_for: int
) -> None:
    """Whatever the window of items running at once, in any order of ends, chunked from
    the start or after a few batches whole."""
    input = [{"n": i % 4, "keep": i % 2 == 0} for i in range(items)]
    expected = run(compile_text(flow), task, input)
    status, output, store = run_chunked(flow, input, seed, window, whole_for)
    assert (status, output) == (expected.status, expected.output)
    # Nothing of the run is left in its entries, and the core holds none of its tables.
    leftovers = [name for name in store.fields if name[:2] in ("r:", "f:", "i:", "w:", "a:", "q:")]
    assert leftovers == []
    core = orjson.loads(store.fields[rec.STATE])
    assert is_chunked(core) and core["live"] == 0 and "running" not in core


def test_the_core_of_a_large_iteration_stays_small_while_its_items_run() -> None:
    machine = Machine(compile_text("A → * B → C"))
    state = ChunkedState()
    (a,) = machine.start(state, {})
    store = Store(state)
    starts = store.apply(machine, [(a, list(range(5000)))])
    assert len(starts) == 5000
    assert len(store.fields[rec.STATE]) < 100  # the same for 5 items or 5 million
    store.apply(machine, [(starts[0], {"x": 1})])
    assert orjson.loads(store.fields[entry_field(("fanin", "2"))]) == [4999, 5000]
    assert orjson.loads(store.fields[entry_field(("output", "2", 0))]) == {"x": 1}
    whole = state_from_fields(store.fields)
    assert len(whole.running) == 4999 and whole.to_whole_dict()["fanin"]["2"][0] == 4999


def test_a_transition_that_needs_every_entry_asks_for_the_whole_state() -> None:
    machine = Machine(compile_text("A → * B → C"))
    state = ChunkedState()
    (a,) = machine.start(state, {})
    store = Store(state)
    starts = store.apply(machine, [(a, [1, 2, 3])])
    partial = store.load([rec.RUNNING_PREFIX + starts[0].key])
    with pytest.raises(Missing) as missing:
        machine.terminate(partial)  # stops every running task: all must be known
    assert missing.value.wanted is None
    whole = state_from_fields(store.fields)
    machine.terminate(whole)
    assert whole.stopped == {s.key: 1 for s in starts} and not whole.running


def test_an_entry_neither_loaded_nor_found_absent_is_missing_not_absent() -> None:
    core = {"status": "running", "live": 2}
    state = partial_state(core, [("r:2.0", b"1"), ("r:2.9", None)])
    assert state.running.get("2.0") == 1 and state.running.get("2.9") is None
    with pytest.raises(Missing) as missing:
        state.running.get("2.1")
    assert missing.value.wanted == [("running", "2.1")]
    assert len(state.running) == 2  # the stored count, not the entries loaded


def test_an_iteration_runs_at_most_its_window_of_items_at_once() -> None:
    machine = Machine(compile_text("A → * B → C"), Limits(window=100))
    state = ChunkedState()
    (a,) = machine.start(state, {})
    store = Store(state)
    running = store.apply(machine, [(a, list(range(2500)))])
    assert len(running) == 100  # the other 2,400 wait in chunks of 1,000
    assert sorted(n for n in store.fields if n.startswith("q:")) == ["q:2/0", "q:2/1", "q:2/2"]
    ended = 0
    while running:
        item, running = running[0], running[1:]
        actions = store.apply(machine, [(item, item.input)])
        ended += 1
        running += [x for x in actions if isinstance(x, StartTask) and x.name == "B"]
        assert len(running) <= 100
    assert ended == 2500
    # C runs now: its entry is all that is left of the run
    assert [n for n in store.fields if n.startswith(("q:", "r:", "f:", "i:"))] == ["r:3"]
