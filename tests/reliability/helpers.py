"""Shared pieces of the fault scenarios: a private engine, a load, the invariants, figures.

Sizes: modest by default (CI), full with ``FLOWSTREAM_FAULTS_FULL=1``. Each
scenario records its figures with :func:`record`; with ``FLOWSTREAM_FAULTS_REPORT``
set to a file, they are appended there as JSON lines (``python -m bench.faults``
collects them into the table of docs/reliability.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis

from flowlang.compiler import compile_text
from flowlang.runner import run
from lifecycle import compact
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.keys import Keys
from lifecycle.submit import start_workflows
from rqse.keys import dead_letter_key
from rqse.server import RedisServer

FULL = os.environ.get("FLOWSTREAM_FAULTS_FULL") == "1"
KEYS = Keys()
# Fan-out and fan-in, a join of two branches and a parallel pair: 11 tasks per workflow.
FLOW = "A :x → * { B → C } → :y D; :x → E → :y; D → F|G"
ENDED = ("finished", "failed", "terminated")


def size(ci: int, full: int) -> int:
    return full if FULL else ci


def record(name: str, **figures: Any) -> None:
    """Print the scenario's figures; append them to ``FLOWSTREAM_FAULTS_REPORT`` if set."""
    line = {"scenario": name, "full": FULL, **figures}
    print(f"\n{name}: {figures}")
    target = os.environ.get("FLOWSTREAM_FAULTS_REPORT")
    if target:
        with open(target, "ab") as out:
            out.write(orjson.dumps(line) + b"\n")


class Engine:
    """A private Redis server (killable, restartable on the same files and port) and the
    worker processes of one scenario, all stopped at teardown."""

    def __init__(
        self,
        directory: Path,
        persistence: str = "none",
        extra: list[str] = (),
        pack_starts: bool = False,
    ) -> None:
        """``pack_starts``: its lifecycle workers pack start-tasks (``--pack-starts``)."""
        self.directory = directory
        self.pack_starts = pack_starts
        directory.mkdir(parents=True, exist_ok=True)
        self.server = RedisServer(
            data_dir=directory / "redis", persistence=persistence, extra_args=list(extra)
        ).start()
        self.url = self.server.url
        self.client = redis.Redis.from_url(self.url, socket_timeout=10)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}

    def start(self, *command: str, url: str | None = None) -> subprocess.Popen[bytes]:
        log = self.directory / f"{command[0]}-{len(self.procs)}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", *command, "--redis-url", url or self.url],
            stdout=subprocess.DEVNULL,
            stderr=open(log, "wb"),  # noqa: SIM115
        )
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def exited(self, procs: list[subprocess.Popen[bytes]]) -> str:
        """'' while every one of ``procs`` runs; else which exited, with its log's end."""
        gone = [proc for proc in procs if proc.poll() is not None]
        return "; ".join(
            f"{' '.join(map(str, proc.args[2:4]))} exited {proc.returncode}: "  # type: ignore[index]
            + self.logs[proc.pid].read_text(errors="replace")[-1500:]
            for proc in gone
        )

    def lifecycle(self, consumer: str, url: str | None = None) -> subprocess.Popen[bytes]:
        packing = ("--pack-starts",) if self.pack_starts else ()
        return self.start(
            "lifecycle", "worker", "--consumer", consumer, "--claim-idle", "1", *packing, url=url
        )

    def noop(self, consumer: str, url: str | None = None) -> subprocess.Popen[bytes]:
        return self.start(
            "workers", "noop", "--kinds", "default", "--consumer", consumer,
            "--claim-idle", "1", url=url,
        )  # fmt: skip

    def receipts(self, archive: Path, *options: str) -> subprocess.Popen[bytes]:
        return self.start("lifecycle", "receipts", "--archive", str(archive), *options)

    def restart_server(self) -> None:
        self.server.start(timeout=60)  # same port, same files: loading the AOF may take a while

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.client.close()
        self.server.stop()


def submit(client: redis.Redis, count: int, prefix: str = "w") -> tuple[list[str], dict]:
    """Start ``count`` workflows of :data:`FLOW`; return their ids and expected outputs."""
    graph = compile_text(FLOW)
    ids = [f"{prefix}{i}" for i in range(count)]
    inputs = [[i, i + 1, i + 2] for i in range(count)]
    start_workflows(client, graph, inputs, ids)
    expected = {
        w: run(graph, lambda c: c.input, x).output for w, x in zip(ids, inputs, strict=True)
    }
    return ids, expected


TASKS_PER_WORKFLOW = len(run(compile_text(FLOW), lambda c: c.input, [0, 1, 2]).calls)


def states(client: redis.Redis, ids: list[str]) -> dict[str, dict]:
    found: dict[str, dict] = {}
    for first in range(0, len(ids), 5000):
        chunk = ids[first : first + 5000]
        rows = compact.read_fields(client, KEYS, chunk, [rec.STATE])  # either form
        for workflow, (s,) in zip(chunk, rows, strict=True):
            found[workflow] = orjson.loads(s) if s else {}
    return found


def wait_all_ended(
    client: redis.Redis,
    ids: list[str],
    timeout: float,
    during: Callable[[], None] | None = None,
) -> dict[str, dict]:
    """Poll until every workflow ended; Redis being away meanwhile is waited out."""
    deadline = time.monotonic() + timeout
    stuck: list[str] = ids
    while time.monotonic() < deadline:
        if during is not None:
            during()
        try:
            found = states(client, ids)
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            time.sleep(0.2)
            continue
        stuck = [w for w, s in found.items() if s.get("status") not in ENDED]
        if not stuck:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{len(stuck)} of {len(ids)} workflows did not end, e.g. {stuck[:3]}")


def decoded(client: redis.Redis, stream: str) -> list[dict[str, Any]]:
    events = []
    for _, fields in client.xrange(stream):
        event = {}
        for name, value in fields.items():
            try:
                event[name.decode()] = orjson.loads(value)
            except orjson.JSONDecodeError:
                event[name.decode()] = value
        events.append(event)
    return events


def start_tasks(client: redis.Redis, stream: str) -> list[dict[str, Any]]:
    """Every start-task on a task stream, those of start-tasks packs unpacked."""
    found = []
    for event in decoded(client, stream):
        if event.get("kind") == ev.START_TASKS:
            found += ev.unpacked_starts("?", event)
        elif event.get("kind") == ev.START_TASK:
            found.append(event)
    return found


def dead_letters(client: redis.Redis, stream: str) -> list[dict[str, Any]]:
    return decoded(client, dead_letter_key(stream))


def check_exactly_once(
    client: redis.Redis, found: dict[str, dict], expected: dict, tasks: bool = True
) -> dict[str, int]:
    """Every workflow finished with the expected output; exactly one end-workflow each;
    every start-task id once in the task stream (recover's resends, marked
    ``recovered``, aside) and none missing. Returns the counts checked."""
    wrong = {w: s.get("output") for w, s in found.items() if s.get("output") != expected[w]}
    assert not wrong, f"{len(wrong)} workflows with a wrong output, e.g. {list(wrong.items())[:2]}"
    assert {s.get("status") for s in found.values()} == {"finished"}
    ends = Counter(
        e["workflow"]
        for e in decoded(client, KEYS.lifecycle)
        if e.get("kind") in ("end-workflow", "failed-workflow") and e.get("workflow") in expected
    )
    twice = [w for w, n in ends.items() if n > 1]
    assert not twice, f"{len(twice)} workflows ended twice, e.g. {twice[:3]}"
    assert set(ends) == set(expected), f"{len(set(expected) - set(ends))} without end-workflow"
    counts = {"workflows": len(found), "end_workflows": sum(ends.values())}
    if tasks:
        starts = Counter(
            e["id"]
            for e in start_tasks(client, KEYS.tasks("default"))
            if e.get("workflow") in expected and e.get("recovered") is not True
        )
        repeated = [i for i, n in starts.items() if n > 1]
        assert not repeated, f"{len(repeated)} task attempts started twice, e.g. {repeated[:3]}"
        assert len(starts) == TASKS_PER_WORKFLOW * len(expected), "task instances missing"
        counts["start_tasks"] = len(starts)
    return counts


def task_progress(client: redis.Redis, workflows: int) -> float:
    """Share of the load's start-tasks written so far (0 to 1): a point mid-run to strike
    at, where counting ended workflows is not (they all end in a late burst). Counted
    from the entries not yet seen, those of start-tasks packs by their tasks."""
    # (the last entry id counted, the tasks so far), kept on the client: one per engine
    last, written = getattr(client, "_tasks_written", ("-", 0))
    try:
        entries = client.xrange(KEYS.tasks("default"), last if last == "-" else f"({last}")
    except redis.ResponseError:
        entries = []
    for entry_id, fields in entries:
        tasks = fields.get(b"tasks")
        written += 1 if tasks is None else len(orjson.loads(tasks))
        last = entry_id.decode()
    client._tasks_written = (last, written)  # type: ignore[attr-defined]
    return written / (TASKS_PER_WORKFLOW * workflows)


def wait_progress(client: redis.Redis, workflows: int, share: float, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while task_progress(client, workflows) < share:
        assert time.monotonic() < deadline, f"the load did not reach {share:.0%} of its tasks"
        time.sleep(0.01)


def peak_rss_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM), in KB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0
