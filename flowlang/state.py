"""A workflow's progress as data: :class:`State`, whole, or :class:`ChunkedState`, by entry.

:class:`flowlang.machine.Machine` reads and changes a state through the few
operations here (the ``running`` table, :meth:`State.arrive`,
:meth:`State.open_fanin`, :meth:`State.collect`), so an engine can store it
either way:

- :class:`State` is one JSON document (:meth:`State.to_dict`). Every change
  rewrites all of it: cheapest for the small states of most workflows.
- :class:`ChunkedState` keeps its tables entry by entry — one running task, one
  iteration's counter, one collected output, one arrival at a join — and
  records which entries a transition changed. An engine stores each entry on
  its own and loads only those a transition touches, so the cost of an event
  does not grow with the size of an iteration or a join. A transition that
  needs an entry that was not loaded raises :class:`Missing`; the caller loads
  it and runs the transition again from the stored state.

Chunked states are for graphs without cycles (:attr:`flowlang.machine.Machine.chunkable`):
there a task instance starts once, so an instance key set that was not loaded is
new, which is what lets a transition start tasks without reading what is stored
under their keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

__all__ = [
    "ARRIVAL",
    "FAILED",
    "FANIN",
    "FINISHED",
    "OUTPUT",
    "QUEUED",
    "QUEUE_CHUNK",
    "RUNNING",
    "RUNNING_TABLE",
    "TERMINATED",
    "WAITING",
    "ChunkedState",
    "Entry",
    "Missing",
    "State",
    "Table",
]

RUNNING, FINISHED, FAILED, TERMINATED = "running", "finished", "failed", "terminated"

# What a chunked state is made of, as (what, key[, index]): the names of Missing entries.
RUNNING_TABLE = "running"  # (RUNNING_TABLE, instance key): the attempt running
FANIN = "fanin"  # (FANIN, collector key): [items left, items]
OUTPUT = "output"  # (OUTPUT, collector key, index): one item's collected output
WAITING = "waiting"  # (WAITING, instance key): arrivals so far at a join
ARRIVAL = "arrival"  # (ARRIVAL, instance key, n): the n-th arrival, [predecessor, value]
QUEUED = "queued"  # (QUEUED, collector key, n): the n-th chunk of items waiting to start
QUEUE_CHUNK = 1000  # queued items per chunk entry
Entry = tuple[str, str] | tuple[str, str, int]


class Missing(Exception):
    """A transition of a partly loaded :class:`ChunkedState` needs entries it was not
    given: ``wanted`` names them, or is None when it needs the whole state (failing or
    terminating a workflow stops everything running). Nothing it changed counts: the
    caller loads what is wanted and runs the transition again on a fresh state."""

    def __init__(self, wanted: Sequence[Entry] | None) -> None:
        super().__init__("entries not loaded" if wanted else "the whole state is needed")
        self.wanted = wanted


@dataclass(slots=True)
class State:
    """Everything a workflow's progress needs, as JSON-ready data.

    ``waiting``: activations of instances below their threshold, ``[pred, value]``;
    ``running``: task instances awaiting their end, key → attempt;
    ``fanin``: open iterations, key of the iterated instance → ``[left, outputs]``;
    ``attempts``: for tasks on or after a cycle only (they can start more than once),
    ``[first attempt of the current invocation, last attempt used]`` per key, so that
    each new invocation of the same instance gets a new attempt number (and so a new
    task instance id) while retries still count from that invocation's first attempt.
    ``started``: task instances started so far, kept only under a ``task_starts`` limit.
    ``stopped``: the task instances running (or failing) when the workflow failed or was
    terminated, key → attempt: what :meth:`Machine.restart` starts again.
    """

    status: str = RUNNING
    waiting: dict[str, list[list[Any]]] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    fanin: dict[str, list[Any]] = field(default_factory=dict)
    attempts: dict[str, list[int]] = field(default_factory=dict)
    output: Any = None
    error: str | None = None
    started: int = 0
    stopped: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"status": self.status}
        if self.waiting:
            data["waiting"] = self.waiting
        if self.running:
            data["running"] = self.running
        if self.fanin:
            data["fanin"] = self.fanin
        return self._with_core(data)

    def _with_core(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` with what every state stores beside its tables."""
        if self.attempts:
            data["attempts"] = self.attempts
        if self.output is not None:
            data["output"] = self.output
        if self.error is not None:
            data["error"] = self.error
        if self.started:
            data["started"] = self.started
        if self.stopped:
            data["stopped"] = self.stopped
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> State:
        get = data.get
        if cls is State and len(data) == 2 and "running" in data and "status" in data:
            # A workflow with tasks running and nothing else (a chain's every state): its
            # empty tables are made here, not looked up (decoded once per event), and its
            # slots set without the dataclass's __init__ (a third of the cost).
            state = _new(State)
            state.status, state.running, state.output, state.error = (
                data["status"], data["running"], None, None
            )  # fmt: skip
            state.waiting, state.fanin, state.attempts, state.stopped = {}, {}, {}, {}
            state.started = 0
            return state
        return cls(  # positional, in field order: cheaper than by name
            get("status", RUNNING),
            get("waiting", {}),
            get("running", {}),
            get("fanin", {}),
            get("attempts", {}),
            get("output"),
            get("error"),
            get("started", 0),
            get("stopped", {}),
        )

    def to_whole_dict(self) -> dict[str, Any]:
        """Every table included, as :meth:`to_dict` stores it: what readers show."""
        return self.to_dict()

    def need_whole(self) -> None:
        """Before an operation over a whole table: a whole state has them all."""

    def arrive(self, key: str, pred: int | None, value: Any, threshold: int) -> list[Any] | None:
        """An activation of instance ``key`` from ``pred``: once ``threshold`` have arrived,
        the first ``threshold`` of them ordered by predecessor (and taken), else None."""
        waiting = self.waiting.setdefault(key, [])
        waiting.append([pred, value])
        if len(waiting) < threshold:
            return None
        taken = sorted(waiting[:threshold], key=_by_predecessor)
        if len(waiting) > threshold:
            self.waiting[key] = waiting[threshold:]
        else:
            del self.waiting[key]
        return [value for _, value in taken]

    def open_fanin(self, key: str, items: int, queued: list[Any] | None = None) -> None:
        """An iteration of ``items`` items opens; its collector instance is ``key``.
        ``queued``: its last items, which start one by one as others end (next_item)."""
        entry: list[Any] = [items, [None] * items]
        if queued:  # [left, outputs, next index, queued items]
            entry += [items - len(queued), queued]
        self.fanin[key] = entry

    def next_item(self, key: str) -> tuple[int, Any] | None:
        """The next queued item of iteration ``key`` to start, (index, item), or None."""
        entry = self.fanin[key]
        if len(entry) < 4 or entry[2] >= len(entry[1]):
            return None
        index, queued = entry[2], entry[3]
        entry[2] += 1
        return index, queued[index - (len(entry[1]) - len(queued))]

    def collect(self, key: str, index: int, output: Any) -> list[Any] | None:
        """Item ``index`` of iteration ``key`` ended with ``output``: when it was the last,
        every item's output in order (and the iteration is closed), else None."""
        entry = self.fanin[key]
        entry[0] -= 1
        entry[1][index] = output
        if entry[0]:
            return None
        del self.fanin[key]
        return entry[1]  # type: ignore[no-any-return]


_new = object.__new__


def _by_predecessor(arrival: list[Any]) -> Any:
    return arrival[0]


class Table(dict[str, Any]):
    """One table of a :class:`ChunkedState`: the entries loaded (or all of them, when
    ``whole``), the size of the whole table, and which entries changed since
    :meth:`ChunkedState.saved`. Reading a key that was neither loaded nor found absent
    raises :class:`Missing`; setting one adds an entry (see the module's note)."""

    __slots__ = ("what", "size", "whole", "absent", "changed", "dropped")

    def __init__(self, what: str, entries: dict[str, Any], size: int, whole: bool) -> None:
        super().__init__(entries)
        self.what = what
        self.size = size
        self.whole = whole
        self.absent: set[str] = set()  # keys loaded and found not stored
        self.changed: set[str] = set()
        self.dropped: set[str] = set()

    def _known(self, key: str) -> bool:
        if self.whole or key in self.absent or dict.__contains__(self, key):
            return True
        raise Missing([(self.what, key)])

    def __contains__(self, key: object) -> bool:
        return self._known(str(key)) and dict.__contains__(self, key)

    def __getitem__(self, key: str) -> Any:
        self._known(key)
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self._known(key)
        return dict.get(self, key, default)

    def __setitem__(self, key: str, value: Any) -> None:
        if not dict.__contains__(self, key):
            self.size += 1
            self.absent.discard(key)
        dict.__setitem__(self, key, value)
        self.changed.add(key)
        self.dropped.discard(key)

    def __delitem__(self, key: str) -> None:
        self._known(key)
        dict.__delitem__(self, key)
        self.size -= 1
        self.absent.add(key)
        self.changed.discard(key)
        self.dropped.add(key)

    def pop(self, key: str, *default: Any) -> Any:  # type: ignore[override]
        if self._known(key) and dict.__contains__(self, key):
            value = dict.__getitem__(self, key)
            del self[key]
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def setdefault(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        if key in self:
            return dict.__getitem__(self, key)
        self[key] = default
        return default

    def clear(self) -> None:
        if not self.whole:
            raise Missing(None)
        for key in list(dict.keys(self)):
            del self[key]

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def mark_saved(self) -> None:
        self.changed.clear()
        self.dropped.clear()


class ChunkedState(State):
    """A :class:`State` whose tables are stored and loaded entry by entry.

    ``running`` is a :class:`Table`; an iteration is its counter in ``fanin``
    (``[items left, items]``) plus one ``outputs`` entry per item collected; a join is
    its arrival count in ``waiting`` plus one ``arrivals`` entry per arrival. After a
    transition, ``changed_outputs``/``dropped_outputs`` and ``changed_arrivals``/
    ``dropped_arrivals`` say which of those entries to write and delete, besides the
    tables' own ``changed`` and ``dropped``; :meth:`saved` clears them all.
    :meth:`to_dict` is the rest: everything but the tables, plus the running count.
    """

    __slots__ = (
        "outputs", "arrivals", "changed_outputs", "dropped_outputs", "changed_arrivals",
        "dropped_arrivals", "queued", "changed_queued", "dropped_queued", "partial",
    )  # fmt: skip

    def __init__(self, core: dict[str, Any] | None = None, *, partial: bool = False) -> None:
        core = core or {}
        super().__init__(
            status=core.get("status", RUNNING),
            attempts=core.get("attempts", {}),
            output=core.get("output"),
            error=core.get("error"),
            started=core.get("started", 0),
            stopped=core.get("stopped", {}),
        )
        whole = not partial
        self.partial = partial
        self.running = Table(RUNNING_TABLE, {}, core.get("live", 0), whole)
        self.fanin = Table(FANIN, {}, 0, whole)
        self.waiting = Table(WAITING, {}, 0, whole)
        self.outputs: dict[str, dict[int, Any]] = {}  # collector key -> index -> output
        self.arrivals: dict[str, dict[int, Any]] = {}  # join key -> n -> [pred, value]
        self.changed_outputs: list[tuple[str, int]] = []
        self.dropped_outputs: list[tuple[str, int]] = []  # (collector key, items): all of them
        self.changed_arrivals: list[tuple[str, int]] = []
        self.dropped_arrivals: list[tuple[str, int]] = []  # (join key, count): all of them
        self.queued: dict[str, dict[int, list[Any]]] = {}  # collector key -> chunk -> items
        self.changed_queued: list[tuple[str, int]] = []
        self.dropped_queued: list[tuple[str, int]] = []  # (collector key, chunk)

    @classmethod
    def of(cls, state: State) -> ChunkedState | None:
        """``state``, whole, as a chunked state whose every entry is to be written; None
        when it cannot tell which outputs an open iteration has collected (one was null)."""
        chunked = cls(state.to_dict())
        running, fanin, waiting = chunked.tables()
        for key, attempt in state.running.items():
            running[key] = attempt
        for key, entry in state.fanin.items():
            left, outputs = entry[0], entry[1]
            collected = [i for i, output in enumerate(outputs) if output is not None]
            if len(collected) != len(outputs) - left:
                return None
            fanin[key] = [left, len(outputs)]
            chunked.outputs[key] = {i: outputs[i] for i in collected}
            chunked.changed_outputs += [(key, i) for i in collected]
            if len(entry) > 2:  # a windowed iteration: its next index and its queued items
                index, queued = entry[2], entry[3]
                first = len(outputs) - len(queued)
                fanin[key] = [left, len(outputs), index, first]
                chunks = chunked.queued[key] = {}
                if index < len(outputs):  # the chunks from the one holding the next item
                    for n in range((index - first) // QUEUE_CHUNK, -(-len(queued) // QUEUE_CHUNK)):
                        chunks[n] = queued[n * QUEUE_CHUNK : (n + 1) * QUEUE_CHUNK]
        for key, arrivals in state.waiting.items():
            waiting[key] = len(arrivals)
            chunked.arrivals[key] = dict(enumerate(arrivals))
            chunked.changed_arrivals += [(key, n) for n in range(len(arrivals))]
        for key, chunks in chunked.queued.items():
            chunked.changed_queued += [(key, n) for n in chunks]
        return chunked

    def to_dict(self) -> dict[str, Any]:
        return self._with_core({"status": self.status, "live": self.tables()[0].size})

    def to_whole_dict(self) -> dict[str, Any]:
        """Every table, its entries gathered: what readers show (needs it whole)."""
        self.need_whole()
        data = self.to_dict()
        del data["live"]
        running, fanin, waiting = self.tables()
        if dict.__len__(running):
            data["running"] = dict(running)
        if dict.__len__(fanin):
            data["fanin"] = {key: self._whole_fanin(key, entry) for key, entry in fanin.items()}
        if dict.__len__(waiting):
            data["waiting"] = {
                key: [self.arrivals.get(key, {}).get(n) for n in range(count)]
                for key, count in dict.items(waiting)
            }
        return data

    def _whole_fanin(self, key: str, entry: list[Any]) -> list[Any]:
        outputs = self.outputs.get(key, {})
        whole = [entry[0], [outputs.get(i) for i in range(entry[1])]]
        if len(entry) > 2:  # the next index, and the items of the chunks not used up
            chunks = self.queued.get(key, {})
            whole += [entry[2], [item for n in sorted(chunks) for item in chunks[n]]]
        return whole

    def need_whole(self) -> None:
        if self.partial:
            raise Missing(None)

    def arrive(self, key: str, pred: int | None, value: Any, threshold: int) -> list[Any] | None:
        waiting = self.tables()[2]
        count = waiting.get(key, 0)
        arrivals = self.arrivals.setdefault(key, {})
        arrivals[count] = [pred, value]
        self.changed_arrivals.append((key, count))
        count += 1
        if count < threshold:
            waiting[key] = count
            return None
        if count > threshold:  # only on a cycle, which chunked states do not have
            raise AssertionError(f"{key}: {count} arrivals for a threshold of {threshold}")
        lacking = [(ARRIVAL, key, n) for n in range(count) if n not in arrivals]
        if lacking:
            raise self._missing(lacking)
        if key in waiting:
            del waiting[key]
        self._drop(key, count, self.arrivals, self.changed_arrivals, self.dropped_arrivals)
        taken = sorted((arrivals[n] for n in range(count)), key=_by_predecessor)
        return [value for _, value in taken]

    def open_fanin(self, key: str, items: int, queued: list[Any] | None = None) -> None:
        fanin = self.tables()[1]
        self.outputs[key] = {}
        if not queued:
            fanin[key] = [items, items]
            return
        first = items - len(queued)  # [left, items, next index, first queued index]
        fanin[key] = [items, items, first, first]
        chunks = self.queued[key] = {}
        for n in range(0, len(queued), QUEUE_CHUNK):
            chunks[n // QUEUE_CHUNK] = queued[n : n + QUEUE_CHUNK]
            self.changed_queued.append((key, n // QUEUE_CHUNK))

    def next_item(self, key: str) -> tuple[int, Any] | None:
        fanin = self.tables()[1]
        entry = fanin[key]
        if len(entry) < 4 or entry[2] >= entry[1]:
            return None
        left, items, index, first = entry
        chunk, offset = divmod(index - first, QUEUE_CHUNK)
        chunks = self.queued.setdefault(key, {})
        if chunk not in chunks:
            raise self._missing([(QUEUED, key, chunk)])
        item = chunks[chunk][offset]
        fanin[key] = [left, items, index + 1, first]
        if offset == QUEUE_CHUNK - 1 or index + 1 == items:  # the chunk is used up
            del chunks[chunk]
            if (key, chunk) in self.changed_queued:
                self.changed_queued.remove((key, chunk))
            self.dropped_queued.append((key, chunk))
        return index, item

    def collect(self, key: str, index: int, output: Any) -> list[Any] | None:
        fanin = self.tables()[1]
        if key not in fanin:  # an item of it ended, so it was opened: its entry is lost
            raise ValueError(f"iteration {key} has no stored entry ({FANIN})")
        entry = fanin[key]
        left, items = entry[0] - 1, entry[1]
        outputs = self.outputs.setdefault(key, {})
        outputs[index] = output
        self.changed_outputs.append((key, index))
        if left:
            fanin[key] = [left, *entry[1:]]
            return None
        lacking = [(OUTPUT, key, i) for i in range(items) if i not in outputs]
        if lacking:
            raise self._missing(lacking)
        del fanin[key]
        self._drop(key, items, self.outputs, self.changed_outputs, self.dropped_outputs)
        return [outputs[i] for i in range(items)]

    def _missing(self, lacking: Sequence[Entry]) -> Exception:
        """What to raise for entries not at hand: :class:`Missing` when only some were
        loaded; for a whole state they are not stored at all, which no run leaves."""
        if self.partial:
            return Missing(lacking)
        shown = ", ".join(map(str, lacking[:3])) + (" ..." if len(lacking) > 3 else "")
        return ValueError(f"the stored state lacks {len(lacking)} entries: {shown}")

    @staticmethod
    def _drop(
        key: str,
        count: int,
        entries: dict[str, dict[int, Any]],
        changed: list[tuple[str, int]],
        dropped: list[tuple[str, int]],
    ) -> None:
        """Entries 0…count-1 of ``key`` go: none of them is written any more."""
        entries.pop(key, None)
        changed[:] = [entry for entry in changed if entry[0] != key]
        dropped.append((key, count))

    def tables(self) -> tuple[Table, Table, Table]:
        """``running``, ``fanin`` and ``waiting``, typed as what they are here."""
        return cast(tuple[Table, Table, Table], (self.running, self.fanin, self.waiting))

    def saved(self) -> None:
        """What changed has been written: the next transition records its own changes."""
        for table in self.tables():
            table.mark_saved()
        self.changed_outputs, self.dropped_outputs = [], []
        self.changed_arrivals, self.dropped_arrivals = [], []
        self.changed_queued, self.dropped_queued = [], []
