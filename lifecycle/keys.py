"""Every Redis key, stream and group name the engine uses — the one place they are spelled.

All keys of a partition share one hash tag, ``{flow}`` by default: a workflow's
record, the lifecycle stream, the task streams and the timers live in one slot, so
the atomic advance (a MULTI/EXEC or one Lua script) only ever touches keys of one
slot. A deployment of several partitions (lifecycle.partitions, for Redis Cluster)
gives each its own tag; the few keys they share (the partition count, the task
kinds' concurrency limits) stay under the base prefix, :attr:`Keys.home`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_KIND", "Keys", "task_kind"]

DEFAULT_KIND = "default"  # the kind of task names without a ``kind:`` prefix
RESOURCE_KIND = "resource"  # URI sources and sinks
LIFECYCLE_GROUP = "lifecycle"
# Consumer groups live inside a stream, so one name serves every kind: the
# group on {flow}:tasks:<kind> is that kind's group, shared by its workers.
TASK_GROUP = "workers"
# The receipts worker's group on every engine stream (lifecycle, task kinds, dead letters).
RECEIPTS_GROUP = "receipts"


def task_kind(name: str, node_kind: str = "task") -> str:
    """The stream a task is routed to: its name's prefix before the first ``:``."""
    if node_kind != "task":
        return RESOURCE_KIND
    prefix, colon, _ = name.partition(":")
    return prefix if colon else DEFAULT_KIND


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under one partition tag (``prefix``), e.g. ``{flow}``; ``home`` is the
    base prefix of the keys every partition shares (the prefix itself when omitted)."""

    prefix: str = "{flow}"
    home: str = ""

    @property
    def shared(self) -> str:
        return self.home or self.prefix

    @property
    def partitions(self) -> str:
        """String: how many partitions the deployment has (absent: 1), set by the first
        lifecycle worker started with ``--partitions`` and checked by every process."""
        return f"{self.shared}:partitions"

    @property
    def lifecycle(self) -> str:
        """Stream of workflow events: start-workflow, end-task, end-workflow, ..."""
        return f"{self.prefix}:lifecycle"

    @property
    def lifecycle_group(self) -> str:
        return LIFECYCLE_GROUP

    def tasks(self, kind: str, priority: int = 0) -> str:
        """Stream of start-task events for one task kind; a priority other than 0 has
        its own, ``<kind stream>:p<N>`` (docs/operations.md, Priorities)."""
        if priority:
            return f"{self.prefix}:tasks:{kind}:p{priority}"
        return f"{self.prefix}:tasks:{kind}"

    @staticmethod
    def task_group(kind: str) -> str:
        """The consumer group that every worker of ``kind`` shares (on that kind's stream)."""
        return TASK_GROUP

    @property
    def kinds(self) -> str:
        """Set of the task kinds that have a stream (for the receipts worker and tools)."""
        return f"{self.prefix}:kinds"

    @property
    def priorities(self) -> str:
        """Set of ``<kind>:<priority>`` (e.g. ``default:5``), one per priority stream other
        than 0 that a submission routed tasks to (lifecycle.priorities reads it)."""
        return f"{self.prefix}:priorities"

    def workflow(self, workflow_id: str) -> str:
        """Hash of one workflow: record fields, machine state, one field per node instance.

        Fields: ``g`` graph hash, ``name``, ``status``, ``created``/``ended`` (ms),
        ``input``, ``output``, ``error``, ``s`` machine state, ``v`` version,
        ``n:<key>`` task instance start record, ``o:<key>`` its end record (their
        forms: :mod:`lifecycle.records`).
        """
        return f"{self.prefix}:wf:{workflow_id}"

    @property
    def compacted(self) -> str:
        """Hash: id -> a finished workflow once retention compacted it, in place of its own
        hash (the format: lifecycle/compact.py): one entry costs less than one key."""
        return f"{self.prefix}:compacted"

    @property
    def graph_refs(self) -> str:
        """Hash: the short names compacted workflows give their graphs: graph hash -> name,
        ``#<name>`` -> graph hash, ``#`` -> the last name given (a count, base 36)."""
        return f"{self.prefix}:graph-refs"

    @property
    def workflows(self) -> str:
        """Sorted set of workflow ids by creation time (ms)."""
        return f"{self.prefix}:workflows"

    @property
    def outcomes(self) -> str:
        """Hash of how many workflows ended, by status: ``finished``, ``failed``,
        ``terminated`` (counted by the commit that ends each one, so exactly once)."""
        return f"{self.prefix}:outcomes"

    @property
    def stopped(self) -> str:
        """Hash of stop records: a workflow that ended failed or terminated -> JSON
        ``{key: attempt}`` of the attempts it stopped (``{}``: all). Task workers skip
        those start-tasks still queued (one HMGET per batch) rather than run work nobody
        will take; a restart's next attempts run. Removed when it finishes after a
        restart, by delete and by retention."""
        return f"{self.prefix}:stopped"

    @property
    def expiring(self) -> str:
        """Sorted set of ended workflows by the time (ms) retention removes them."""
        return f"{self.prefix}:expiring"

    @property
    def expiring_compacted(self) -> str:
        """List of the compacted workflows (:attr:`compacted`) in the order retention
        removes them, ``<id> <due>`` each (ms, base 36; the record says it too): cheaper
        per workflow than :attr:`expiring`; :attr:`expiring_compacted_last` is when its
        last is due."""
        return f"{self.prefix}:expiring-compacted"

    @property
    def expiring_compacted_last(self) -> str:
        """String: when the last entry of :attr:`expiring_compacted` is due (ms)."""
        return f"{self.prefix}:expiring-compacted-last"

    @property
    def limits(self) -> str:
        """String: JSON of the limits the lifecycle workers run with (those set apart from
        the defaults), set by each at start; replay and recover compute with them."""
        return f"{self.prefix}:limits"

    @property
    def retention(self) -> str:
        """String: the lifecycle workers' retention in ms (0: kept until deleted), set by
        each at start; replay tells a workflow removed on time from one Redis lost."""
        return f"{self.prefix}:retention"

    @property
    def archive(self) -> str:
        """String: where the receipts worker archives, JSON ``{"path": absolute
        directory, "host": hostname}``, set by it at start; ``history`` and
        ``inspect`` name it, and ``history --archive`` reads it by default."""
        return f"{self.prefix}:archive"

    @property
    def timers(self) -> str:
        """Sorted set of durable timers, scored by due time (ms)."""
        return f"{self.prefix}:timers"

    # -- Workflows under a concurrency key (run --concurrency-key K --max-running N) -----

    def key_running(self, concurrency_key: str) -> str:
        """Set of the workflows of a concurrency key admitted and not yet ended (at most
        its max-running); written only by ``engine/scripts/gate.lua``."""
        return f"{self.prefix}:running:{concurrency_key}"

    def key_queue(self, concurrency_key: str) -> str:
        """Sorted set of the workflows of a concurrency key waiting to start, by their
        start-workflow's stream entry id (``ms * 1000 + seq``): admitted in that order."""
        return f"{self.prefix}:run-queue:{concurrency_key}"

    # -- Concurrency limits per task kind (lifecycle/kind_limits.py) ---------------------
    # Under the home prefix: one limit counts the tasks of its kind in every partition.

    @property
    def kind_limits(self) -> str:
        """Hash: task kind -> how many of its tasks may run at once, across all workers
        (``python -m lifecycle limit``). Not :attr:`limits`, which is the data limits."""
        return f"{self.shared}:kind-limits"

    def slots(self, kind: str) -> str:
        """Sorted set of the holders of ``kind``'s slots: ``<slot_name> <consumer>`` ->
        lease expiry (ms, Redis clock); a holder renews it while its tasks run. A holder
        holds one slot, or a batch's (:meth:`slot_batches`)."""
        return f"{self.shared}:slots:{kind}"

    def slot_batches(self, kind: str) -> str:
        """Sorted set of the holders that hold a whole batch's slots: member -> how many
        (2 or more); member ``+``: the sum of their slots beyond one each."""
        return f"{self.shared}:slot-batches:{kind}"

    def slot_queue(self, kind: str) -> str:
        """Sorted set of the tasks waiting for a slot of ``kind``, by their order (from
        the start-task's stream entry id): who gets in next."""
        return f"{self.shared}:slot-queue:{kind}"

    def slot_waiting(self, kind: str) -> str:
        """Sorted set of the same waiters -> lease expiry (ms): a waiter that died leaves
        the line once it lapses."""
        return f"{self.shared}:slot-waiting:{kind}"

    def slot_wake(self, kind: str) -> str:
        """Prefix of the per-waiter wake-up lists (``<prefix><member>``): a waiter blocks
        on its own (BLPOP) until a slot may be its; each expires after a lease."""
        return f"{self.shared}:slot-wake:{kind}:"

    def graph(self, content_hash: str) -> str:
        """A compiled graph's canonical JSON, stored once per content hash, shared."""
        return f"{self.prefix}:graph:{content_hash}"

    # -- Schedules (lifecycle.schedules, fired by lifecycle.engine.schedules) -------------

    @property
    def schedules(self) -> str:
        """Sorted set of every schedule's name, scored by its next fire time (ms, Redis
        clock); +inf while it is paused."""
        return f"{self.prefix}:schedules"

    def schedule(self, name: str) -> str:
        """Hash of one schedule: its definition and what it last did (records.SCHEDULE_*)."""
        return f"{self.prefix}:schedule:{name}"

    def schedule_runs(self, name: str) -> str:
        """Sorted set of the workflow ids a schedule started, scored by fire time (ms).
        Each fire drops its oldest entries whose workflow retention or delete removed."""
        return f"{self.prefix}:schedule-runs:{name}"

    # -- Built-in wait: tasks (workers/wait.py, docs/workers.md) ------------------------
    # Durable state of waits in progress; a WaitWorker restart loses none of it.

    @property
    def waits(self) -> str:
        """Hash of registered waits: task instance id -> JSON record (the end-task to
        send when the wait is over). Removing a field is what makes an end-task once."""
        return f"{self.prefix}:wait:tasks"

    @property
    def wait_delays(self) -> str:
        """Sorted set of wait:delay task instance ids, scored by due time (ms, Redis clock)."""
        return f"{self.prefix}:wait:delays"

    def wait_events(self, event_kind: str) -> str:
        """Hash of wait:event waits for events of ``event_kind``: task id -> JSON
        ``{match, since, receipt}``."""
        return f"{self.prefix}:wait:event:{event_kind}"

    def latch(self, name: str) -> str:
        """Counter of one global countdown latch (absent = 0)."""
        return f"{self.prefix}:latch:{name}"

    def latch_waiters(self, name: str) -> str:
        """Set of wait:countdown task instance ids waiting for ``name`` to reach 0."""
        return f"{self.prefix}:latch-waiting:{name}"


# -- Built-in wait: tasks (workers/wait.py) ------------------------------------------
WAIT_KIND = "wait"  # the built-in kind: {flow}:tasks:wait, served by workers.wait.WaitWorker
# The WaitWorker's group on {flow}:lifecycle (wait:event watches that stream); its
# own name, so that it never shares entries with any other reader of the stream.
WAIT_EVENTS_GROUP = "wait"
