"""A keyed workflow under its limit starts in the commit that queues it.

The gate admits it in that commit's own transaction and sends its held start-tasks
itself, each marked ``admitted``: no second advance, and nothing on the lifecycle stream
(replay applies the admission where the archive shows those start-tasks, so replay and
recover agree with what ran). Past the limit, a workflow waits and is admitted by a
plain ``admit-workflow``. A batch makes one gate call for all its workflows under keys,
their starts and their ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from flowlang.graph import Graph
from flowlang.runner import TaskCall
from lifecycle import events as ev
from lifecycle import records as rec
from lifecycle.audit.recover import recover
from lifecycle.audit.report import audit_archive
from lifecycle.engine.advance import Advancer
from lifecycle.engine.commit import Commit
from lifecycle.engine.gate import gate_command, gate_packed
from lifecycle.engine.store import load_workflow
from lifecycle.keys import TASK_GROUP, Keys
from lifecycle.submit import graph_task_kinds, start_workflow
from tests.lifecycle.audit_helpers import archive_all
from tests.lifecycle.harness import (
    Harness,
    ScriptOnly,
    admitted_workflows,
    decode,
    direct_admissions,
)

KEYS = Keys()
FLOW = compile_text("A → B")
TIMED = compile_text("A (- $timeout: 3600 -) → B")


def ok(call: TaskCall) -> Any:
    return {"done": call.name}


def submit(harness: Harness, workflow_id: str, most: int, graph: Graph = FLOW) -> str:
    for kind in graph_task_kinds(graph) - harness.kinds:
        harness._group(KEYS.tasks(kind), TASK_GROUP)
        harness.kinds.add(kind)
    return start_workflow(
        harness.client, graph, None, workflow_id, KEYS, concurrency_key="k", max_running=most
    )


def read_batch(client: redis.Redis) -> list[tuple[str, dict[str, Any]]]:
    reply = client.xreadgroup(KEYS.lifecycle_group, "t", {KEYS.lifecycle: ">"}, count=500)
    return [(i.decode(), decode(f)) for _, items in reply or [] for i, f in items]


def admissions(client: redis.Redis) -> list[tuple[str, bool]]:
    """(workflow, sent) of every admit-workflow on the lifecycle stream, in order."""
    return [
        (event["workflow"], event.get(ev.ADMIT_SENT) is True)
        for event in (decode(f) for _, f in client.xrange(KEYS.lifecycle))
        if event["kind"] == ev.ADMIT_WORKFLOW
    ]


def direct(client: redis.Redis) -> list[str]:
    return direct_admissions(client, KEYS)


def _ms(entry_id: bytes) -> int:
    return int(entry_id.split(b"-")[0])


def started(client: redis.Redis) -> list[str]:
    return [decode(f)["workflow"] for _, f in client.xrange(KEYS.tasks("default"))]


def test_a_keyed_workflow_under_its_limit_starts_its_first_task_in_one_advance(
    harness: Harness,
) -> None:
    ids = [submit(harness, f"w{n}", most=2) for n in range(2)]
    first = harness.advancer.apply(read_batch(harness.client))
    assert first.committed == 2
    assert started(harness.client) == ids  # sent by the commits that queued them
    assert direct(harness.client) == ids
    for workflow in ids:
        record = harness.client.hgetall(KEYS.workflow(workflow))
        assert orjson.loads(record[rec.CONCURRENCY.encode()]) == {"key": "k", "max": 2}
        assert rec.PAUSED.encode() not in record
        assert record[rec.VERSION.encode()] == b"1"  # one commit, no admission advance
    # Nothing left for a lifecycle worker to read: no admit-workflow was written.
    assert admissions(harness.client) == []
    assert read_batch(harness.client) == []


def test_an_admit_workflow_already_carried_out_is_acknowledged_with_nothing_done(
    harness: Harness,
) -> None:
    # As the gate wrote them for every admission in its commit before its start-tasks
    # carried the mark, and still does for an offer without start-tasks: still on the
    # stream after an upgrade, they must change nothing.
    submit(harness, "w0", most=2)
    harness.advance()
    version = harness.client.hget(KEYS.workflow("w0"), rec.VERSION)
    harness.client.xadd(
        KEYS.lifecycle,
        {"kind": b'"admit-workflow"', "workflow": b'"w0"', ev.ADMIT_SENT: b"true"},
    )
    result = harness.advancer.apply(read_batch(harness.client))
    assert result.committed == 0 and len(result.duplicates) == 1
    assert harness.client.hget(KEYS.workflow("w0"), rec.VERSION) == version
    assert harness.client.xlen(KEYS.tasks("default")) == 1  # nothing sent twice


def queue(commit: Commit, held: list[Any]) -> None:
    """What the transition writes of a workflow it queues under key k, with ``held`` as
    the offer of its start-tasks."""
    commit.set(rec.CONCURRENCY, orjson.dumps({"key": "k", "max": 5, "queued": True}))
    commit.set(rec.PAUSED, orjson.dumps(["1"] * len(held)))
    commit.offer, commit.offer_admitted = held, orjson.dumps({"key": "k", "max": 5})


def test_an_offer_without_start_tasks_is_written_as_an_admit_workflow_sent(
    redis_client: redis.Redis,
) -> None:
    commit = Commit(KEYS, "w1")
    commit.enter("k", 5, 1)
    queue(commit, [])
    gate = gate_command([commit], check=False)
    assert gate is not None
    assert redis_client.execute_command(*gate) == [1]
    (entry,) = [decode(f) for _, f in redis_client.xrange(KEYS.lifecycle)]
    assert entry == {"kind": ev.ADMIT_WORKFLOW, "workflow": "w1", ev.ADMIT_SENT: True}
    assert redis_client.smembers(KEYS.key_running("k")) == {b"w1"}


def test_past_its_limit_a_workflow_waits_and_a_plain_admission_starts_it(
    harness: Harness,
) -> None:
    ids = [submit(harness, f"w{n}", most=1) for n in range(3)]
    harness.advance()
    assert started(harness.client) == ["w0"]
    assert direct(harness.client) == ["w0"] and admissions(harness.client) == []
    harness.pump(ok)
    # Each next one admitted by the commit that ended the one before: a plain admission,
    # applied by an advance of its own.
    assert admissions(harness.client) == [("w1", False), ("w2", False)]
    assert direct(harness.client) == ["w0"]
    assert started(harness.client) == ["w0", "w0", "w1", "w1", "w2", "w2"]
    assert harness.client.scard(KEYS.key_running("k")) == 0
    assert _states(harness.client, ids) == ["finished"] * 3


def _states(client: redis.Redis, ids: list[str]) -> list[str]:
    return [orjson.loads(client.hget(KEYS.workflow(w), rec.STATE))["status"] for w in ids]


def test_a_direct_admission_sets_its_timeout_timer_and_replay_and_recover_agree(
    harness: Harness, tmp_path: Path
) -> None:
    workflow = submit(harness, "timed", most=5, graph=TIMED)
    harness.advance()
    ((member, due),) = harness.client.zrange(KEYS.timers, 0, -1, withscores=True)
    timer = orjson.loads(member)
    assert (timer["kind"], timer["workflow"], timer["attempt"]) == (ev.TIMEOUT_TASK, workflow, 1)
    t0 = load_workflow(harness.client, KEYS, workflow).starts[timer["key"]][1]
    assert 3_599_000 <= due - t0 <= 3_601_000  # from the start, as an unkeyed workflow's
    archive_all(harness.client, tmp_path / "archive")
    report = audit_archive(tmp_path / "archive", KEYS, client=harness.client)
    assert report.ok, report.first_problem
    assert {w.live for w in report.workflows} == {"equal"}
    (replayed,) = report.workflows
    assert abs(replayed.timers[member.decode()] - due) < 1000
    # Redis loses it: recover restores it admitted, with its timer, its task not sent twice.
    harness.client.delete(KEYS.workflow(workflow), KEYS.timers, KEYS.key_running("k"))
    restored = recover(harness.client, tmp_path / "archive", KEYS)
    assert restored.restored == [workflow]
    assert harness.client.smembers(KEYS.key_running("k")) == {workflow.encode()}
    assert harness.client.zcard(KEYS.timers) == 1
    harness.pump(ok)
    assert _states(harness.client, [workflow]) == ["finished"]


def test_replay_of_direct_and_waiting_admissions_matches_the_live_records(
    harness: Harness, tmp_path: Path
) -> None:
    ids = [submit(harness, f"w{n}", most=2) for n in range(5)]
    harness.pump(ok)
    assert direct(harness.client) == ["w0", "w1"]
    assert sorted(admissions(harness.client)) == [("w2", False), ("w3", False), ("w4", False)]
    archive_all(harness.client, tmp_path / "archive")
    report = audit_archive(tmp_path / "archive", KEYS, client=harness.client)
    assert report.ok, report.first_problem
    assert sorted(w.workflow for w in report.workflows) == ids
    assert {w.live for w in report.workflows} == {"equal"}


def test_the_script_path_also_admits_directly(harness: Harness) -> None:
    harness.advancer = ScriptOnly(harness.client, KEYS)
    ids = [submit(harness, f"w{n}", most=2) for n in range(3)]
    harness.advance()
    assert started(harness.client) == ids[:2]
    assert direct(harness.client) == ["w0", "w1"] and admissions(harness.client) == []
    harness.pump(ok)
    assert _states(harness.client, ids) == ["finished"] * 3


def test_a_lost_race_sends_no_start_task_and_admits_nothing(
    redis_client: redis.Redis,
) -> None:
    redis_client.hset(KEYS.workflow("w1"), rec.VERSION, "2")  # another worker wrote 2
    commit = Commit(KEYS, "w1")
    commit.set(rec.VERSION, 3)  # what its commit would have written, had it won
    commit.enter("k", 5, 1)
    held = Commit(KEYS, "w1")
    held.append(KEYS.tasks("default"), {"kind": ev.START_TASK, "workflow": "w1"})
    queue(commit, held.events)
    gate = gate_command([commit])
    assert gate is not None
    assert redis_client.execute_command(*gate) == [0]
    assert redis_client.xlen(KEYS.tasks("default")) == 0
    assert redis_client.scard(KEYS.key_running("k")) == 0
    assert redis_client.zcard(KEYS.key_queue("k")) == 0


def test_two_lifecycle_workers_racing_never_run_more_than_the_limit(
    redis_client: redis.Redis, pool: redis.ConnectionPool, in_threads: Any
) -> None:
    from lifecycle.worker import LifecycleWorker
    from tests.conftest import wait_until
    from workers.noop import NoopWorker

    # Redis reports every change of the key's running set in the order it makes them,
    # inside scripts and transactions too: the exact count of workflows admitted and
    # not yet ended at every moment.
    redis_client.config_set("notify-keyspace-events", "Ks")
    watcher = redis_client.pubsub()
    watcher.subscribe(f"__keyspace@0__:{KEYS.key_running('k')}")
    try:
        options = {"pool": pool, "handle_signals": False, "block_ms": 20}
        in_threads(*[LifecycleWorker(batch_size=3, **options) for _ in range(2)])
        in_threads(NoopWorker(["default"], **options))
        most, count = 3, 40
        ids = [
            start_workflow(
                redis_client, FLOW, None, f"w{n:02}", KEYS, concurrency_key="k", max_running=most
            )
            for n in range(count)
        ]
        wait_until(
            lambda: (
                redis_client.hlen(KEYS.outcomes) > 0
                and int(redis_client.hget(KEYS.outcomes, rec.FINISHED) or 0) == count
            ),
            timeout=30,
            what="all to finish",
        )
        changes = []
        while (message := watcher.get_message(timeout=0.5)) is not None:
            if message["type"] == "message":
                changes.append(message["data"])
    finally:
        watcher.close()
        redis_client.config_set("notify-keyspace-events", "")
    running = peak = 0
    for change in changes:  # one sadd per admission, one srem per end
        running += {b"sadd": 1, b"srem": -1}[change]
        assert running >= 0
        peak = max(peak, running)
    assert peak == most and running == 0
    assert changes.count(b"sadd") == count
    # Each admitted exactly once, in its own commit or by an admit-workflow; every
    # start-task of one admitted by an admit-workflow sent after it.
    assert sorted(admitted_workflows(redis_client, KEYS)) == ids
    admitted_at = {
        decode(f)["workflow"]: _ms(i)
        for i, f in redis_client.xrange(KEYS.lifecycle)
        if decode(f)["kind"] == ev.ADMIT_WORKFLOW
    }
    starts = [
        (decode(f)["workflow"], _ms(i)) for i, f in redis_client.xrange(KEYS.tasks("default"))
    ]
    assert len(starts) == 2 * count
    assert all(at >= admitted_at.get(workflow, 0) for workflow, at in starts)
    assert redis_client.scard(KEYS.key_running("k")) == 0
    assert redis_client.zcard(KEYS.key_queue("k")) == 0


def test_a_wide_first_step_is_admitted_at_once_with_every_start_task_and_timer(
    harness: Harness,
) -> None:
    wide = compile_text("* B (- $timeout: 3600 -) → C")
    for kind in graph_task_kinds(wide) - harness.kinds:
        harness._group(KEYS.tasks(kind), TASK_GROUP)
        harness.kinds.add(kind)
    start_workflow(
        harness.client, wide, list(range(4500)), "wide", KEYS, concurrency_key="k", max_running=1
    )
    harness.advance()
    # More timers than one unpack() in Lua can take (about 8,000 values).
    assert harness.client.xlen(KEYS.tasks("default")) == 4500
    assert harness.client.zcard(KEYS.timers) == 4500
    assert direct(harness.client) == ["wide"] and admissions(harness.client) == []
    marked = [decode(f).get(ev.ADMITTED) for _, f in harness.client.xrange(KEYS.tasks("default"))]
    assert marked == [True] * 4500


def test_a_restart_with_room_is_admitted_in_its_own_commit_and_replay_agrees(
    harness: Harness, tmp_path: Path
) -> None:
    from lifecycle.client import Client

    client = Client(harness.client, KEYS)
    workflow = submit(harness, "w0", most=1)
    harness.advance()
    client.terminate(workflow)
    harness.advance()
    client.restart(workflow)
    harness.advance()  # the restart: in line again, admitted at once, its task sent again
    marked = [decode(f).get(ev.ADMITTED) for _, f in harness.client.xrange(KEYS.tasks("default"))]
    assert marked == [True, True] and admissions(harness.client) == []
    assert started(harness.client) == [workflow, workflow]
    harness.pump(ok)
    assert _states(harness.client, [workflow]) == ["finished"]
    archive_all(harness.client, tmp_path / "archive")
    report = audit_archive(tmp_path / "archive", KEYS, client=harness.client)
    assert report.ok, report.first_problem
    assert {w.live for w in report.workflows} == {"equal"}


def _evals(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_eval", {}).get("calls", 0))


def test_a_batch_makes_one_gate_call_for_all_its_workflows_under_keys(
    harness: Harness,
) -> None:
    for n in range(6):
        start_workflow(
            harness.client, FLOW, None, f"w{n}", KEYS,
            concurrency_key="k" if n % 2 else "j", max_running=2,
        )  # fmt: skip
    harness._group(KEYS.tasks("default"), TASK_GROUP)
    harness.kinds.add("default")
    before = _evals(harness.client)
    harness.advance()  # six starts under two keys: two of each admitted, two in line
    assert _evals(harness.client) == before + 1
    assert sorted(direct(harness.client)) == ["w0", "w1", "w2", "w3"]
    assert harness.client.zrange(KEYS.key_queue("j"), 0, -1) == [b"w4"]
    assert harness.client.zrange(KEYS.key_queue("k"), 0, -1) == [b"w5"]
    harness.work(ok)
    harness.advance()
    harness.work(ok)  # the B answers of the four admitted: applying them ends them
    before = _evals(harness.client)
    harness.advance()  # four ends, two keys: the two in line are admitted
    assert _evals(harness.client) == before + 1
    assert admissions(harness.client) == [("w4", False), ("w5", False)]
    harness.pump(ok)
    assert _states(harness.client, [f"w{n}" for n in range(6)]) == ["finished"] * 6
    assert harness.client.scard(KEYS.key_running("j")) == 0
    assert harness.client.scard(KEYS.key_running("k")) == 0


def test_a_gate_section_redis_refuses_fails_its_workflow_alone(harness: Harness) -> None:
    bad = compile_text("bad:A → B")
    harness._group(KEYS.tasks("default"), TASK_GROUP)
    harness.kinds.add("default")
    harness.client.set(KEYS.tasks("bad"), "not a stream")  # its XADD is refused
    first = submit(harness, "w0", most=5)
    start_workflow(harness.client, bad, None, "w1", KEYS, concurrency_key="k", max_running=5)
    last = submit(harness, "w2", most=5)
    harness.advance()
    assert sorted(direct(harness.client)) == [first, last]
    record = harness.client.hgetall(KEYS.workflow("w1"))
    state = orjson.loads(record[rec.STATE.encode()])
    assert state["status"] == "failed"
    assert "WRONGTYPE" in record[rec.STATE.encode()].decode()
    harness.pump(ok)
    assert _states(harness.client, [first, last]) == ["finished", "finished"]
    # The failed one frees the place it was given before its start-task was refused.
    assert harness.client.smembers(KEYS.key_running("k")) == set()


@contextmanager
def redis_full(client: redis.Redis) -> Iterator[None]:
    """Redis out of memory (noeviction) while the block runs."""
    client.config_set("maxmemory-policy", "noeviction")
    client.set("ballast", "x" * 3_000_000)
    client.config_set("maxmemory", "1mb")
    try:
        yield
    finally:
        client.config_set("maxmemory", "0")
        client.delete("ballast")


@pytest.mark.parametrize("path", ["watched", "script"])
def test_a_keyed_start_meeting_a_full_redis_is_admitted_whole_or_not_at_all(
    harness: Harness, path: str
) -> None:
    # A watched transaction's plain writes are refused as they are queued: nothing is
    # written and the batch is tried again. advance.lua's writes go through (its first,
    # an XACK, is allowed, and a script that wrote goes on), so the gate's must as well,
    # or the workflow would stand queued with its start acknowledged, admitted by nobody.
    if path == "script":
        harness.advancer = ScriptOnly(harness.client, KEYS)
    submit(harness, "w0", most=1)
    entries = read_batch(harness.client)
    refused = False
    with redis_full(harness.client):
        try:
            harness.advancer.apply(entries)
        except redis.exceptions.OutOfMemoryError:
            refused = True
    assert refused == (path == "watched")
    if refused:
        assert harness.client.hget(KEYS.workflow("w0"), rec.VERSION) is None
        harness.advancer.apply(entries)  # the worker's retry, once there is room
    assert direct(harness.client) == ["w0"]
    harness.pump(ok)
    assert _states(harness.client, ["w0"]) == ["finished"]
    assert harness.client.scard(KEYS.key_running("k")) == 0


class Racing(Advancer):
    """Runs ``intrude`` once, between computing its commits and committing them."""

    intrude: Any = None

    def _commit_watched(self, commits: list[Commit], extra: list[str], send: Any) -> Any:
        if self.intrude is not None:
            intrude, self.intrude = self.intrude, None
            intrude()
        return super()._commit_watched(commits, extra, send)


def test_a_workflow_queuing_while_an_end_commits_is_admitted_by_that_end(
    harness: Harness,
) -> None:
    racing = harness.advancer = Racing(harness.client, KEYS)
    submit(harness, "w0", most=1)
    harness.advance()
    harness.work(ok)
    harness.advance()
    harness.work(ok)  # B's answer is on the stream: applying it ends w0
    (end,) = read_batch(harness.client)
    submit(harness, "w1", most=1)
    (start,) = read_batch(harness.client)
    # Another worker queues w1 (w0 still holds the only place) after this one computed
    # its end: the end's gate, which reads the line in the EXEC, must admit w1.
    other = Advancer(redis.Redis(connection_pool=harness.client.connection_pool), KEYS)
    racing.intrude = lambda: other.apply([start])
    result = racing.apply([end])
    assert result.conflicts == 0 and result.committed == 1
    assert direct(harness.client) == ["w0"] and admissions(harness.client) == [("w1", False)]
    harness.pump(ok)
    assert _states(harness.client, ["w0", "w1"]) == ["finished", "finished"]
    assert started(harness.client) == ["w0", "w0", "w1", "w1"]


def test_the_packed_gate_call_is_the_gate_command_packed() -> None:
    import hiredis

    from flowlang.machine import Machine
    from lifecycle.engine.commit import Pending, Said
    from lifecycle.engine.transition import Transition

    graph = compile_text("{ A (- $timeout: 60 -) B } → C")

    class Graphs:
        def machine(self, digest: str) -> Machine:
            return Machine(graph)

    def started_under(key: str, workflow: str) -> Commit:
        event = ev.parse_input(
            "1-0",
            ev.START_WORKFLOW,
            {
                "kind": ev.START_WORKFLOW, "workflow": workflow, "graph": "g",
                "input": {"x": "%s\r\n"}, "salt": "s", "concurrency_key": key,
                "max_running": 3,
            },
        )  # fmt: skip
        commit = Transition(Graphs(), KEYS).compute(
            Pending(workflow, [("1-0", ev.START_WORKFLOW, event)]), Said(), 5
        )
        assert commit is not None and commit.offer is not None and len(commit.offer) == 2
        assert commit.offer_timers  # A's timeout
        return commit

    leaving = Commit(KEYS, "w9")
    leaving.set(rec.VERSION, 7)
    leaving.leave("k", 3)
    plain = Commit(KEYS, "w8")  # no key: no section
    plain.set(rec.VERSION, 2)
    commits = [started_under("k", "w1"), plain, leaving, started_under("j", "w2")]
    for check in (True, False):
        command = gate_command(commits, check)
        assert command is not None
        assert gate_packed(commits, check) == hiredis.pack_command(command)
    assert gate_command([plain]) is None and gate_packed([plain]) is None


def test_the_lifecycle_acl_of_the_security_doc_allows_every_admission_path(
    harness: Harness, redis_url: str
) -> None:
    import secrets
    import shlex

    security = Path(__file__).resolve().parents[2] / "docs" / "security.md"
    line = next(
        text
        for text in security.read_text(encoding="utf-8").splitlines()
        if text.startswith("ACL SETUSER flowstream-lifecycle reset")
    )
    name, password = f"test-admit-{secrets.token_hex(4)}", secrets.token_hex(8)
    rules = [f">{password}" if rule == ">PASSWORD" else rule for rule in shlex.split(line)[3:]]
    harness.client.execute_command("ACL", "SETUSER", name, *rules)
    limited = redis.Redis.from_url(redis_url, username=name, password=password)
    try:
        ids = [submit(harness, f"w{n}", most=1) for n in range(3)]
        harness.advancer = Advancer(limited, KEYS)
        harness.advance()  # w0 admitted at once
        harness.advancer = ScriptOnly(limited, KEYS)  # then the script path too
        harness.work(ok)
        harness.advance()
        harness.work(ok)
        harness.advance()  # w0 ends: its gate admits w1
        harness.advancer = Advancer(limited, KEYS)  # the rest: watched transactions
        harness.pump(ok)
        assert _states(harness.client, ids) == ["finished"] * 3
        refused = [entry for entry in harness.client.acl_log() if entry.get("username") == name]
        assert refused == []
    finally:
        limited.close()
        harness.client.execute_command("ACL", "DELUSER", name)


def test_a_start_and_its_termination_in_one_batch_send_nothing_and_admit_nothing(
    harness: Harness,
) -> None:
    submit(harness, "w0", most=1)
    harness.client.xadd(
        KEYS.lifecycle,
        {name: orjson.dumps(value) for name, value in ev.terminate_workflow("w0").items()},
    )
    result = harness.advancer.apply(read_batch(harness.client))
    assert result.committed == 1
    assert _states(harness.client, ["w0"]) == ["terminated"]
    assert started(harness.client) == [] and admissions(harness.client) == []
    assert harness.client.scard(KEYS.key_running("k")) == 0
    assert harness.client.zcard(KEYS.key_queue("k")) == 0


def _replayed_as_rewritten(
    directory: Path,
    ids: list[str],
    inputs: Callable[[dict[str, Any]], list[dict[str, Any]]],
    emitted: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """The workflows ``ids`` replayed from the archive in ``directory``, each archived
    lifecycle input rewritten by ``inputs`` (into none or several) and each archived
    start-task and end by ``emitted``: an archive as another engine would have written it."""
    from lifecycle.audit.archive import read_archive
    from lifecycle.audit.replay import ArchiveGraphs, WorkflowReplay, replay_workflow

    graphs, items = ArchiveGraphs(), {w: WorkflowReplay(w) for w in ids}
    for _, record in read_archive(directory):
        if "graph" in record:
            graphs.add(record["graph"], record["text"])
            continue
        event, stream = record.get("event"), record.get("stream")
        if not isinstance(event, dict) or event.get("workflow") not in items:
            continue
        item = items[event["workflow"]]
        if stream == KEYS.lifecycle and event["kind"] in ev.LIFECYCLE_INPUTS:
            item.inputs += [(stream, record["id"], written) for written in inputs(event)]
        elif event["kind"] in (ev.START_TASK, ev.END_WORKFLOW):
            item.emitted.append((stream, record["id"], emitted(event)))
    return {w: replay_workflow(item, graphs, KEYS) for w, item in items.items()}


def test_an_archive_written_before_start_tasks_carried_the_mark_replays_equal(
    harness: Harness, tmp_path: Path
) -> None:
    ids = [submit(harness, f"w{n}", most=2) for n in range(4)]
    harness.pump(ok)
    archive_all(harness.client, tmp_path / "archive")

    def as_before(event: dict[str, Any]) -> list[dict[str, Any]]:
        if event["kind"] != ev.START_WORKFLOW or event["workflow"] not in ("w0", "w1"):
            return [event]
        # How the gate wrote a direct admission then: an admit-workflow, sent.
        admit = {"kind": ev.ADMIT_WORKFLOW, "workflow": event["workflow"], ev.ADMIT_SENT: True}
        return [event, admit]

    def unmarked(event: dict[str, Any]) -> dict[str, Any]:
        return {name: value for name, value in event.items() if name != ev.ADMITTED}

    replayed = _replayed_as_rewritten(tmp_path / "archive", ids, as_before, unmarked)
    for workflow in ids:
        assert replayed[workflow].divergence is None, replayed[workflow].divergence
        state = replayed[workflow].state
        assert state is not None and state.status == "finished"


def test_replay_without_the_marked_start_tasks_says_where_it_diverges(
    harness: Harness, tmp_path: Path
) -> None:
    submit(harness, "w0", most=1)
    harness.pump(ok)
    archive_all(harness.client, tmp_path / "archive")
    # The mark taken away: nothing says it was admitted, so its tasks never ran.
    replayed = _replayed_as_rewritten(
        tmp_path / "archive", ["w0"], lambda event: [event], lambda e: {**e, ev.ADMITTED: False}
    )
    assert replayed["w0"].divergence is not None


def test_an_event_behind_the_start_in_its_batch_meets_it_queued_and_replay_agrees(
    harness: Harness, tmp_path: Path
) -> None:
    # The pause is applied after the start in the same batch, while the workflow waits:
    # refused. The admission then goes as an admit-workflow after the pause, so replay,
    # which applies events in stream order, refuses the pause too.
    submit(harness, "w0", most=1)
    harness.client.xadd(
        KEYS.lifecycle,
        {name: orjson.dumps(value) for name, value in ev.control(ev.PAUSE_WORKFLOW, "w0").items()},
    )
    result = harness.advancer.apply(read_batch(harness.client))
    assert [reason.split(": ", 1)[1] for _, reason in result.rejected] == [
        "pause-workflow of w0: the workflow is queued (waiting for its concurrency key); "
        "nothing runs yet"
    ]
    assert direct(harness.client) == [] and admissions(harness.client) == [("w0", False)]
    harness.pump(ok)
    assert _states(harness.client, ["w0"]) == ["finished"]
    archive_all(harness.client, tmp_path / "archive")
    report = audit_archive(tmp_path / "archive", KEYS, client=harness.client)
    assert report.ok, report.first_problem
    assert {w.live for w in report.workflows} == {"equal"}


def test_a_terminate_and_restart_in_one_batch_with_the_key_full_keep_its_held_tasks(
    harness: Harness, tmp_path: Path
) -> None:
    ids = [submit(harness, f"w{n}", most=2) for n in range(3)]
    harness.advance()  # w0 and w1 run, w2 waits
    assert harness.client.zrange(KEYS.key_queue("k"), 0, -1) == [b"w2"]
    for kind in (ev.TERMINATE_WORKFLOW, ev.RESTART_WORKFLOW):
        harness.client.xadd(
            KEYS.lifecycle,
            {name: orjson.dumps(value) for name, value in ev.control(kind, "w2").items()},
        )
    harness.advance()  # w2 leaves its line, restarted waits in it again: nobody has room
    record = harness.client.hgetall(KEYS.workflow("w2"))
    assert orjson.loads(record[rec.PAUSED.encode()]) == ["1"]  # A, held until its turn
    assert rec.is_queued(record[rec.CONCURRENCY.encode()])
    harness.pump(ok)
    assert _states(harness.client, ids) == ["finished"] * 3
    archive_all(harness.client, tmp_path / "archive")
    report = audit_archive(tmp_path / "archive", KEYS, client=harness.client)
    assert report.ok, report.first_problem
    assert {w.live for w in report.workflows} == {"equal"}
