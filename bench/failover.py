"""A Redis Cluster master SIGKILLed mid-run: what its replica's takeover loses,
leaves stuck or runs twice, and what replay and recover say about it.

``python -m bench.failover [--workflows 1000] [--partitions 6] [--kill-at 0.3]
[--wait-replicas] [--runs N] [--json F]`` starts a local cluster of 3 masters and
3 replicas, the engine against it (two lifecycle workers, a counting no-op worker
that logs each task it runs to a file, the receipts worker archiving into a temp
dir), submits W chain10 workflows (each partition's in one call: acknowledged
when the call returns; with ``--wait-replicas`` a ``WAIT 1 1000`` on each
partition's master after its submission, as a submitter that needs durability
would), SIGKILLs the master of partition 0 once ``--kill-at`` of the workflows
have ended (0: right after the last submission returned), measures the failover
(the kill to the first successful write to that master's partitions), waits
until every workflow ended or nothing moved for ``--stall`` seconds, and prints
per run: finished, stuck (a record that never ended), lost (acknowledged, no
record, no start-workflow left in Redis), task attempts run more than once (from
the run logs, outside Redis), what ``python -m lifecycle replay ARCHIVE
--cluster`` says, and what ``python -m lifecycle recover`` then restores.

docs/reliability.md, "Redis Cluster failover", has the figures and why.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson
import redis

from bench.counting_worker import read_runs
from bench.rig import spawn, stop_processes
from flowlang.compiler import compile_text
from lifecycle import compact
from lifecycle import records as rec
from lifecycle.audit.archive import ArchivedEvent, iter_archive
from lifecycle.deployment import Deployment
from lifecycle.events import END_TASK, START_TASK, START_WORKFLOW
from lifecycle.keys import RECEIPTS_GROUP, Keys
from lifecycle.partitions import Partitions
from lifecycle.submit import start_workflow_once, start_workflows
from rqse.cluster import Connections, SlotPool
from rqse.connection import resolve_url
from rqse.server import LocalCluster, RedisServer

__all__ = ["FailoverFigures", "main", "run_once"]

CHAIN10 = " → ".join(f"T{n}" for n in range(10))
_START_WORKFLOW_JSON = orjson.dumps(START_WORKFLOW)  # how the kind field is stored
# Before the load, a few workflows in every partition prove every worker listens on
# every partition's streams.
WARMUP_PER_PARTITION = 2
# Redis errors while the cluster fails over (a dead master, CLUSTERDOWN, MOVED).
# The user a replica cut off (--replica-lag) is made to log in as, turned off.
_REPLICATION_USER = "bench-failover-replication"
_WEATHER = (redis.ConnectionError, redis.TimeoutError, redis.ResponseError)


@dataclass
class FailoverFigures:
    run: int
    wait_replicas: bool
    workflows: int
    partitions: int
    kill_at: float
    replica_lag: float
    killed_partitions: list[int] = field(default_factory=list)
    replica_acks: list[int] = field(default_factory=list)  # WAIT's replies, by partition
    ended_at_kill: int = 0
    failover_s: float | None = None
    wall_s: float = 0.0
    finished: int = 0
    stuck: int = 0
    stuck_by_partition: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    lost_by_partition: dict[str, int] = field(default_factory=dict)
    resubmitted: int = 0  # submitted again by id (start_workflow_once) when WAIT said 0
    started_again: int = 0  # of those, the ids the failover had lost
    unapplied: int = 0  # no record, but the start-workflow is still in the stream
    task_runs: int = 0
    runs_twice: int = 0  # task attempts run more than once (run logs)
    archived_end_twice: int = 0  # attempts whose end-task the archive holds twice or more
    archived_start_twice: int = 0  # start-task ids the archive holds twice or more
    replay: dict[str, Any] = field(default_factory=dict)
    recover: dict[str, Any] = field(default_factory=dict)


def _wait_archiving(deployment: Deployment, archive: Path, timeout: float = 30) -> None:
    """Until the receipts worker reads every partition (its group exists on each
    lifecycle stream, its archive directory too)."""
    deadline = time.monotonic() + timeout
    partitions = deployment.partitions
    for index, keys in enumerate(partitions.all):
        client = deployment.client_for(keys)
        while not (
            partitions.archive(archive, index).is_dir()
            and client.exists(keys.lifecycle)
            and any(
                g["name"] == RECEIPTS_GROUP.encode() for g in client.xinfo_groups(keys.lifecycle)
            )
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the receipts worker did not start in {timeout:g} s")
            time.sleep(0.1)


def _master_of(connections: Connections, keys: Keys) -> tuple[str, int]:
    """(host, port) of the master holding a partition now."""
    pool = connections.pool_for(keys.prefix)
    assert isinstance(pool, SlotPool), "bench.failover runs on a Redis Cluster"
    return pool.address


def _warm_ids(partitions: Partitions) -> list[str]:
    """Ids giving every partition WARMUP_PER_PARTITION workflows."""
    ids: list[str] = []
    per: Counter[int] = Counter()
    n = 0
    while len(ids) < WARMUP_PER_PARTITION * partitions.count:
        workflow, n = f"warm-{n}", n + 1
        index = partitions.index_of(workflow)
        if per[index] < WARMUP_PER_PARTITION:
            per[index] += 1
            ids.append(workflow)
    return ids


def _submit(deployment: Deployment, ids: list[str], wait_replicas: bool) -> dict[int, int]:
    """Each partition's workflows in one call to its master; with ``wait_replicas`` a
    ``WAIT 1 1000`` after it. Returns the replicas that acknowledged, by partition."""
    graph = compile_text(CHAIN10)
    acks = {}
    for index, chosen in sorted(deployment.partitions.group(ids).items()):
        keys = deployment.partitions.keys(index)
        client = deployment.client_for(keys)
        start_workflows(client, graph, [{"n": n} for n in range(len(chosen))], chosen, keys)
        if wait_replicas:
            acks[index] = int(client.wait(1, 1000))
    return acks


def _resubmit(deployment: Deployment, ids: list[str], partitions: list[int]) -> tuple[int, int]:
    """Submit again, each only if its id is unknown, the workflows of ``partitions``;
    (how many were submitted again, how many of those started)."""
    graph = compile_text(CHAIN10)
    by_partition = deployment.partitions.group(ids)
    sent = started = 0
    for index in partitions:
        keys = deployment.partitions.keys(index)
        client = deployment.client_for(keys)
        for n, workflow in enumerate(by_partition.get(index, [])):
            sent += 1
            started += start_workflow_once(client, graph, {"n": n}, workflow, keys)
    return sent, started


def _ended(deployment: Deployment) -> int | None:
    """Workflows ended in every partition (outcome counters); None while one fails over."""
    try:
        outcomes = deployment.outcomes()
    except _WEATHER:
        return None
    return sum(outcomes.get(s, 0) for s in ("finished", "failed", "terminated"))


def _wait_ended(deployment: Deployment, target: int, stall: float) -> bool:
    """Until ``target`` workflows ended (True) or none ended for ``stall`` s (False)."""
    last, seen = time.monotonic(), -1
    while True:
        ended = _ended(deployment)
        if ended is not None and ended >= target:
            return True
        if ended is not None and ended != seen:
            last, seen = time.monotonic(), ended
        elif time.monotonic() - last > stall:
            return False
        time.sleep(0.1)


def _cut_replication(master: RedisServer, replica: RedisServer) -> None:
    """Cut ``replica`` off ``master``'s replication stream, the cluster bus left alone:
    a replica behind its master (a slow or broken link). The replica is made to log in
    as a user the master then turns off, and its link is closed: it cannot come back,
    while the master goes on accepting writes (``min-replicas-to-write`` is 0)."""
    source = redis.Redis(port=master.port)
    target = redis.Redis(port=replica.port)
    try:
        source.execute_command("ACL", "SETUSER", _REPLICATION_USER, "off")
        target.config_set("masteruser", _REPLICATION_USER)
        target.config_set("masterauth", "unused")
        source.execute_command("CLIENT", "KILL", "TYPE", "replica")
    finally:
        source.close()
        target.close()


def _first_write(client: redis.Redis, keys: Keys, began: float, timeout: float = 60) -> float:
    """Seconds from ``began`` to the first write the partition's master accepts."""
    while time.monotonic() - began < timeout:
        try:
            client.set(f"{keys.prefix}:bench-failover-probe", 1)
            return round(time.monotonic() - began, 2)
        except _WEATHER:
            time.sleep(0.02)
    raise RuntimeError(f"{keys.prefix}: no write accepted {timeout:g} s after the kill")


def _census(
    deployment: Deployment, ids: list[str]
) -> tuple[int, dict[str, int], dict[str, int], int, list[str]]:
    """(finished, stuck by partition, lost by partition, unapplied, some lost ids)."""
    finished, stuck, lost, unapplied, lost_ids = 0, Counter[str](), Counter[str](), 0, []
    for index, chosen in deployment.partitions.group(ids).items():
        keys = deployment.partitions.keys(index)
        client = deployment.client_for(keys)
        # (a compacted workflow has no version: it finished)
        rows = compact.read_fields(client, keys, chosen, [rec.VERSION, rec.ENDED])
        missing = []
        for workflow, (version, ended) in zip(chosen, rows, strict=True):
            if version is None and ended is None:
                missing.append(workflow)
            elif ended is None:
                stuck[str(index)] += 1
            else:
                finished += 1
        if not missing:
            continue
        entries = client.xrange(keys.lifecycle)
        waiting = {
            orjson.loads(fields[b"workflow"])
            for _, fields in cast(list[tuple[bytes, dict[bytes, bytes]]], entries)
            if fields.get(b"kind") == _START_WORKFLOW_JSON and b"workflow" in fields
        }
        for workflow in missing:
            if workflow in waiting:
                unapplied += 1
            else:
                lost[str(index)] += 1
                lost_ids.append(workflow)
    return finished, dict(stuck), dict(lost), unapplied, lost_ids[:10]


def _archive_twice(archive: Path, partitions: Partitions) -> tuple[int, int]:
    """(attempts whose end-task is archived more than once, start-task ids archived
    more than once)."""
    ends: Counter[tuple[Any, ...]] = Counter()
    starts: Counter[Any] = Counter()
    for index in range(partitions.count):
        for read in iter_archive(partitions.archive(archive, index)):
            if not isinstance(read, ArchivedEvent) or read.event is None:
                continue
            event = read.event
            if event.get("kind") == END_TASK:
                ends[(event.get("workflow"), event.get("key"), event.get("attempt"))] += 1
            elif event.get("kind") == START_TASK:
                starts[event.get("id")] += 1
    return sum(n > 1 for n in ends.values()), sum(n > 1 for n in starts.values())


_REPLAYED = re.compile(
    r"(\d+) workflows? replayed \((\d+) archive records read\), (\d+) diverged, "
    r"(\d+) lost in Redis"
)
_RESTORED = re.compile(r"(\d+) restored, (\d+) start-tasks sent again, (\d+) not restored")


def _lifecycle_cli(url: str, *command: str, log: Path | None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "lifecycle", *command, "--redis-url", url, "--cluster"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if log is not None:
        log.write_text(done.stdout + done.stderr)
    return done.stdout + done.stderr


def _replay(url: str, archive: Path, log: Path | None) -> dict[str, Any]:
    """What ``lifecycle replay ARCHIVE --cluster`` says, summed over the partitions."""
    out = _lifecycle_cli(url, "replay", str(archive), log=log)
    totals = {"workflows": 0, "diverged": 0, "lost_in_redis": 0}
    for found in _REPLAYED.finditer(out):
        totals["workflows"] += int(found[1])
        totals["diverged"] += int(found[3])
        totals["lost_in_redis"] += int(found[4])
    live = Counter(m[1] for m in re.finditer(r"replay (?:equal|DIVERGED), live (.+)", out))
    divergences = re.findall(r"first diverging event [^:]*: (.+)", out)
    return {**totals, "live": dict(live), "divergences": divergences[:5]}


def _recover(url: str, archive: Path, log: Path | None) -> dict[str, Any]:
    out = _lifecycle_cli(url, "recover", "--archive", str(archive), log=log)
    totals = {"restored": 0, "resent": 0, "not_restored": 0}
    for found in _RESTORED.finditer(out):
        totals["restored"] += int(found[1])
        totals["resent"] += int(found[2])
        totals["not_restored"] += int(found[3])
    why = re.findall(r"not restored \S+: (.+)", out)
    return {**totals, "why_not": why[:5]}


class _Engine:
    """The worker processes of one run, started and stopped together."""

    def __init__(self, url: str, args: argparse.Namespace, work: Path, logs: Path | None, run: int):
        self.url, self.args, self.work, self.logs, self.run = url, args, work, logs, run
        self.procs: list[subprocess.Popen[bytes]] = []

    def _log(self, name: str) -> Path | None:
        return self.logs / f"{name}.log" if self.logs else None

    def start(self, deployment: Deployment, receipts: bool = True) -> None:
        claim = str(self.args.claim_idle)
        for n in range(2):
            command: tuple[str, ...] = (
                "lifecycle",
                "worker",
                "--cluster",
                "--partitions",
                str(self.args.partitions),
            )
            command += ("--no-wait", "--consumer", f"lc{n}", "--claim-idle", claim)
            self.procs.append(spawn(self.url, *command, log=self._log(f"lc{n}")))
            if n == 0:
                self._wait_count(deployment)
        runs = ("--runs", str(self.runs), "--cluster", "--claim-idle", claim)
        self.procs.append(spawn(self.url, "bench.counting_worker", *runs, log=self._log("w0")))
        if receipts:
            command = ("lifecycle", "receipts", "--cluster", "--archive", str(self.archive))
            self.procs.append(spawn(self.url, *command, log=self._log("receipts")))

    @property
    def runs(self) -> Path:
        """The task runs' logs: kept in the logs directory when there is one."""
        return self.logs / f"runs{self.run}" if self.logs else self.work / "runs"

    @property
    def archive(self) -> Path:
        """The receipts archive: kept in the logs directory when there is one."""
        return self.logs / f"archive{self.run}" if self.logs else self.work / "archive"

    def _wait_count(self, deployment: Deployment) -> None:
        """The first lifecycle worker stores the count the others check."""
        deadline = time.monotonic() + 30
        while True:
            try:
                deployment.partitions  # noqa: B018 - reads and checks the stored count
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        stop_processes(self.procs)
        self.procs.clear()


def run_once(args: argparse.Namespace, run: int, logs: Path | None) -> FailoverFigures:
    figures = FailoverFigures(
        run=run,
        wait_replicas=args.wait_replicas,
        workflows=args.workflows,
        partitions=args.partitions,
        kill_at=args.kill_at,
        replica_lag=args.replica_lag,
    )
    with ExitStack() as stack:
        cluster = stack.enter_context(LocalCluster(masters=3, replicas=1))
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-failover-")))
        connections = Connections.open(resolve_url(cluster.url, None), cluster=True)
        deployment = Deployment(connections, "{flow}", args.partitions)
        stack.callback(deployment.close)
        victim = cluster.nodes[0]  # the master of partition 0 (slot order), checked below
        # Every process (those started after the kill too) reaches the cluster through
        # a node that survives.
        url = f"redis://127.0.0.1:{cluster.nodes[1].port}"
        engine = _Engine(url, args, work, logs, run)
        stack.callback(engine.stop)
        engine.start(deployment)
        partitions = deployment.partitions
        _wait_archiving(deployment, engine.archive)

        warm = _warm_ids(partitions)
        _submit(deployment, warm, False)
        if not _wait_ended(deployment, len(warm), args.stall):
            raise RuntimeError("the warm-up workflows did not end: the engine is not up")

        victim_keys = partitions.keys(0)
        address = _master_of(connections, victim_keys)
        assert address[1] == victim.port, f"partition 0 is on {address}, not on nodes[0]"
        figures.killed_partitions = [
            i for i, keys in enumerate(partitions.all) if _master_of(connections, keys) == address
        ]
        replica = cluster.replicas_of(0)[0]
        ids = [f"w{n}" for n in range(args.workflows)]
        began = time.monotonic()
        # With --kill-at 0 the replica is cut off before the submissions (they are the
        # tail it misses), or with --cut-after-submit after them (the first advances are).
        cut_first = args.replica_lag and not args.kill_at and not args.cut_after_submit
        if cut_first:
            _cut_replication(victim, replica)
        acks = _submit(deployment, ids, args.wait_replicas)
        figures.replica_acks = [acks[i] for i in sorted(acks)]
        target = len(warm) + round(args.kill_at * args.workflows)
        while args.kill_at > 0 and (_ended(deployment) or 0) < target:
            time.sleep(0.01)
        if args.replica_lag:
            if not cut_first:
                _cut_replication(victim, replica)
            time.sleep(args.replica_lag)
        figures.ended_at_kill = (_ended(deployment) or 0) - len(warm)
        cluster.kill(victim)
        killed = time.monotonic()
        figures.failover_s = _first_write(deployment.client_for(victim_keys), victim_keys, killed)
        # A submitter that needs durability resubmits, by id, what no replica
        # acknowledged: only the ids the failover lost start (start_workflow_once).
        unsure = [i for i, acked in acks.items() if acked < 1]
        figures.resubmitted, figures.started_again = _resubmit(deployment, ids, unsure)
        _wait_ended(deployment, len(warm) + args.workflows, args.stall)
        figures.wall_s = round(time.monotonic() - began, 2)
        finished, stuck, lost, unapplied, _ = _census(deployment, ids)
        figures.finished, figures.unapplied = finished, unapplied
        figures.stuck, figures.stuck_by_partition = sum(stuck.values()), stuck
        figures.lost, figures.lost_by_partition = sum(lost.values()), lost

        time.sleep(2)  # the receipts worker archives the last events
        engine.stop()
        runs = Counter(read_runs(engine.runs))
        figures.task_runs = sum(runs.values())
        figures.runs_twice = sum(n > 1 for n in runs.values())
        figures.archived_end_twice, figures.archived_start_twice = _archive_twice(
            engine.archive, partitions
        )
        if args.no_audit:
            return figures
        figures.replay = _replay(url, engine.archive, logs and logs / f"replay{run}.txt")
        recovered = _recover(url, engine.archive, logs and logs / f"recover{run}.txt")
        if recovered["restored"] or figures.stuck or figures.lost:
            engine.start(deployment, receipts=False)
            _wait_ended(deployment, len(warm) + args.workflows, args.stall)
            finished, stuck, lost, _, _ = _census(deployment, ids)
            engine.stop()
            runs = Counter(read_runs(engine.runs))
            recovered["after"] = {
                "finished": finished,
                "stuck": sum(stuck.values()),
                "lost": sum(lost.values()),
                "task_runs": sum(runs.values()),
                "runs_twice": sum(n > 1 for n in runs.values()),
            }
        figures.recover = recovered
    return figures


def _by(partitions: dict[str, int]) -> str:
    """`` (partition 0: 3, ...)`` when any; nothing when none."""
    if not partitions:
        return ""
    return " (" + ", ".join(f"partition {i}: {n}" for i, n in sorted(partitions.items())) + ")"


def _print(row: FailoverFigures) -> None:
    wait = "WAIT" if row.wait_replicas else "no WAIT"
    print(
        f"run {row.run} ({wait}): {row.workflows} submitted, killed the master of partitions "
        f"{row.killed_partitions} at {row.ended_at_kill} ended"
        + (f" (its replica {row.replica_lag:g} s behind)" if row.replica_lag else "")
        + f"; WAIT acks {row.replica_acks}; failover {row.failover_s} s; "
        f"{row.finished} finished, {row.stuck} stuck{_by(row.stuck_by_partition)}, "
        f"{row.lost} lost{_by(row.lost_by_partition)} ({row.unapplied} not yet applied); "
        + (
            f"{row.resubmitted} resubmitted by id, {row.started_again} of them started; "
            if row.resubmitted
            else ""
        )
        + f"{row.task_runs} task runs, {row.runs_twice} attempts run twice "
        f"(archive: {row.archived_end_twice} end-tasks, {row.archived_start_twice} start-tasks "
        f"twice); all ended in {row.wall_s} s"
    )
    replay = row.replay
    if not replay:
        return
    print(
        f"  replay: {replay.get('workflows')} replayed, {replay.get('diverged')} diverged, "
        f"{replay.get('lost_in_redis')} lost in Redis; live {replay.get('live')}"
    )
    for divergence in replay.get("divergences", []):
        print(f"    {divergence}")
    recover = row.recover
    print(
        f"  recover: {recover.get('restored')} restored, {recover.get('resent')} start-tasks "
        f"sent again, {recover.get('not_restored')} not restored"
        + (f"; then {recover['after']}" if "after" in recover else "")
    )
    for why in recover.get("why_not", []):
        print(f"    {why}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.failover", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--workflows", type=int, default=1000, help="chain10 workflows (1000)")
    parser.add_argument("--partitions", type=int, default=6, help="partitions (default 6)")
    parser.add_argument(
        "--kill-at", type=float, default=0.3, help="share ended at the kill (0: after submitting)"
    )
    parser.add_argument(
        "--wait-replicas", action="store_true", help="WAIT 1 1000 after each submission"
    )
    parser.add_argument(
        "--replica-lag",
        type=float,
        default=0.0,
        metavar="S",
        help="cut the victim's replica off its master S seconds before the kill (0: never)",
    )
    parser.add_argument(
        "--cut-after-submit",
        action="store_true",
        help="with --kill-at 0: cut the replica off after the submissions, not before",
    )
    parser.add_argument(
        "--no-audit", action="store_true", help="without running replay and recover after"
    )
    parser.add_argument("--runs", type=int, default=1, help="runs, each on a new cluster")
    parser.add_argument("--claim-idle", type=float, default=2.0, help="workers' --claim-idle")
    parser.add_argument("--stall", type=float, default=30.0, help="give up after this idle")
    parser.add_argument("--logs", help="write each process's output to DIR")
    parser.add_argument("--json", help="also write the figures to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    Partitions("{flow}", args.partitions)  # a bad count: said before anything starts
    if not 0 <= args.kill_at < 1:
        print(f"--kill-at {args.kill_at}: expected a share from 0 to below 1", file=sys.stderr)
        return 2
    logs = Path(args.logs) if args.logs else None
    if logs:
        logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for run in range(1, args.runs + 1):
        row = run_once(args, run, logs)
        _print(row)
        rows.append(row)
    if args.json:
        Path(args.json).write_bytes(
            orjson.dumps([asdict(row) for row in rows], option=orjson.OPT_INDENT_2)
        )
    ended = all(not row.lost and not row.stuck for row in rows)
    return 0 if ended else 1


if __name__ == "__main__":
    sys.exit(main())
