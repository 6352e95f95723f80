"""Starting and terminating workflows: store the compiled graph, send the event."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson
import redis

from flowlang.graph import Graph, NodeKind
from flowlang.limits import DEFAULT_LIMITS, Limits, encode_value
from flowlang.policy import split_params
from lifecycle import events as ev
from lifecycle.errors import LifecycleError
from lifecycle.keys import Keys, task_kind
from lifecycle.priorities import check_priority, priority_member
from rqse import fastpipe, lua
from rqse.fastpipe import SLOT, Template

_SCRIPTS = lua.scripts_dir(__file__)

__all__ = [
    "BadConcurrency",
    "check_concurrency",
    "encode_event",
    "encode_start",
    "graph_task_kinds",
    "register_streams",
    "start_workflows",
    "new_workflow_id",
    "start_workflow",
    "start_workflow_once",
    "terminate_workflow",
    "validate_policies",
]


class BadConcurrency(LifecycleError):
    """Raised when a concurrency key or its max-running is not valid (one without the
    other, an empty key, a max below 1)."""


def new_workflow_id(graph: Graph) -> str:
    """``<flow name or 'workflow'>-<uuid4>``: readable in listings, unique everywhere."""
    return f"{graph.name or 'workflow'}-{uuid.uuid4()}"


def validate_policies(graph: Graph) -> None:
    """Raise FlowPolicyError for a bad ``$retries``/``$backoff``/``$timeout`` in any task."""
    for node in graph.nodes:
        if node.kind in (NodeKind.TASK, NodeKind.SOURCE, NodeKind.SINK):
            split_params(node.params)


def graph_task_kinds(graph: Graph) -> set[str]:
    """The task kinds (streams) a graph's tasks, URI sources and sinks are routed to."""
    return {
        task_kind(n.name or "", str(n.kind))
        for n in graph.nodes
        if n.kind in (NodeKind.TASK, NodeKind.SINK) or (n.kind is NodeKind.SOURCE and n.name)
    }


def register_streams(pipe: Any, keys: Keys, graph: Graph, priority: int) -> None:
    """Name the streams the graph's tasks go to, for workers and tools to find: its kinds
    and, for a priority other than 0, their streams of that priority."""
    kinds = sorted(graph_task_kinds(graph))
    if kinds:
        pipe.sadd(keys.kinds, *kinds)
        if priority:
            pipe.sadd(keys.priorities, *(priority_member(kind, priority) for kind in kinds))


def encode_event(event: dict[str, Any]) -> dict[str, bytes]:
    return {name: orjson.dumps(value) for name, value in event.items()}


def encode_start(
    workflow_id: str,
    digest: str,
    input: Any,
    limits: Limits,
    priority: int = 0,
    concurrency_key: str | None = None,
    max_running: int | None = None,
    claimed: bool = False,
) -> dict[str, bytes]:
    """The start-workflow's fields, its input checked against the limits (the input's
    encoding is the check, and what is sent). ``claimed``: the id is put in the workflows
    index along with the start (lifecycle.events.start_workflow)."""
    event = ev.start_workflow(
        workflow_id,
        digest,
        None,
        priority=priority,
        concurrency_key=concurrency_key,
        max_running=max_running,
        claimed=claimed,
    )
    fields = encode_event(event)
    fields["input"] = encode_value(input, limits, f"the input of workflow {workflow_id}")
    return fields


def check_concurrency(concurrency_key: str | None, max_running: int | None) -> None:
    """Raise :class:`BadConcurrency` unless both or neither are given, a non-empty key and
    a whole number >= 1."""
    problem = ev.concurrency_problem(concurrency_key, max_running)
    if problem is not None:
        raise BadConcurrency(problem)


def start_workflow(
    client: redis.Redis,
    graph: Graph,
    input: Any = None,
    workflow_id: str | None = None,
    keys: Keys | None = None,
    limits: Limits = DEFAULT_LIMITS,
    *,
    priority: int = 0,
    concurrency_key: str | None = None,
    max_running: int | None = None,
) -> str:
    """Store ``graph`` (once per content hash) and ask the lifecycle to start it.

    Starting the same ``workflow_id`` twice starts it once. An input past ``limits``
    raises :class:`flowlang.limits.LimitExceeded` and nothing is stored; a ``priority``
    out of range (lifecycle.priorities) :class:`BadPriority`. With a
    ``concurrency_key``, at most ``max_running`` workflows of that key run at once: this
    one waits ``queued`` until a place is free (in the order they were sent).
    """
    keys = keys or Keys()
    workflow_id = workflow_id or new_workflow_id(graph)
    return start_workflows(
        client,
        graph,
        [input],
        [workflow_id],
        keys,
        limits=limits,
        priority=priority,
        concurrency_key=concurrency_key,
        max_running=max_running,
    )[0]


def start_workflows(
    client: redis.Redis,
    graph: Graph,
    inputs: list[Any],
    workflow_ids: list[str] | None = None,
    keys: Keys | None = None,
    chunk: int = 1000,
    limits: Limits = DEFAULT_LIMITS,
    *,
    priority: int = 0,
    concurrency_key: str | None = None,
    max_running: int | None = None,
) -> list[str]:
    """Start one workflow per input, pipelined ``chunk`` at a time; return their ids.

    Every input is checked against ``limits`` before anything is stored: one that
    breaks them raises :class:`flowlang.limits.LimitExceeded` and nothing is sent.
    ``priority`` (lifecycle.priorities) is every one's; ``concurrency_key``/``max_running``:
    as :func:`start_workflow`, for each."""
    keys = keys or Keys()
    check_priority(priority)
    validate_policies(graph)
    check_concurrency(concurrency_key, max_running)
    digest = graph.content_hash()
    ids = workflow_ids or [new_workflow_id(graph) for _ in inputs]
    # Only the inputs are kept encoded until sent: the events are made a chunk at a
    # time (all of them held at once doubled a large submission's CPU, in fresh memory).
    encoded = [
        encode_value(value, limits, f"the input of workflow {workflow_id}")
        for workflow_id, value in zip(ids, inputs, strict=True)
    ]
    xadd = _start_command(keys, digest, priority, concurrency_key, max_running)
    # The graph and the kinds go first, in the same round trip as the first events.
    commands = _Commands()
    commands.set(keys.graph(digest), graph.to_json(), nx=True)
    register_streams(commands, keys, graph, priority)
    dumps, salt = orjson.dumps, ev.new_salt
    for first in range(0, len(ids), chunk):
        last = first + chunk
        commands += [
            xadd(dumps(workflow_id), value, dumps(salt()))
            for workflow_id, value in zip(ids[first:last], encoded[first:last], strict=True)
        ]
        # A dropped connection is retried as redis-py's pipeline retried it (the
        # client's policy): a start-workflow sent twice starts its workflow once.
        send = partial(fastpipe.execute, client, commands)
        retry = client.get_retry()
        replies = send() if retry is None else retry.call_with_retry(send, lambda error: None)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        commands = _Commands()
    return ids


class _Commands(list[fastpipe.Command]):
    """Commands for :func:`fastpipe.execute`, with the pipeline methods
    :func:`register_streams` calls."""

    def set(self, key: str, value: bytes, nx: bool = False) -> None:
        self.append(("SET", key, value, "NX") if nx else ("SET", key, value))

    def sadd(self, key: str, *members: str) -> None:
        self.append(("SADD", key, *members))


# The fields of a start-workflow that differ from one workflow to the next, in the
# order a Template's slots are filled.
_PER_WORKFLOW = ("workflow", "input", "salt")


def _start_command(
    keys: Keys,
    digest: str,
    priority: int,
    concurrency_key: str | None,
    max_running: int | None,
) -> Callable[[bytes, bytes, bytes], bytes]:
    """The packed XADD of one start-workflow from its encoded id, input and salt: the
    fields :func:`lifecycle.events.start_workflow` gives, in its order, the ones shared
    by every workflow of a submission packed once (redis-py's pipeline converted each
    argument of each event in Python, most of a large submission's CPU)."""
    event = ev.start_workflow(
        "",
        digest,
        None,
        salt="",
        priority=priority,
        concurrency_key=concurrency_key,
        max_running=max_running,
    )
    slots = tuple(name for name in event if name in _PER_WORKFLOW)
    if slots != _PER_WORKFLOW:  # a new per-workflow field, or a new order
        raise AssertionError(f"start-workflow fields {slots}, expected {_PER_WORKFLOW}")
    arguments: list[str | bytes | None] = ["XADD", keys.lifecycle, "*"]
    for name, value in event.items():
        arguments += [name, SLOT if name in _PER_WORKFLOW else orjson.dumps(value)]
    return Template(*arguments).fill


def start_workflow_once(
    client: redis.Redis,
    graph: Graph,
    input: Any,
    workflow_id: str,
    keys: Keys | None = None,
    limits: Limits = DEFAULT_LIMITS,
    *,
    priority: int = 0,
    concurrency_key: str | None = None,
    max_running: int | None = None,
) -> bool:
    """Start ``workflow_id`` only if no workflow has that id (in Redis, or started and not
    yet applied); False when it is taken and nothing was sent. The check and the start
    are one step (``start_once.lua``): two callers racing for one id start it once.
    ``concurrency_key``/``max_running``: as :func:`start_workflow`."""
    keys = keys or Keys()
    check_priority(priority)
    validate_policies(graph)
    check_concurrency(concurrency_key, max_running)
    digest = graph.content_hash()
    fields = encode_start(
        workflow_id, digest, input, limits, priority, concurrency_key, max_running, claimed=True
    )
    pipe = client.pipeline(transaction=False)
    pipe.set(keys.graph(digest), graph.to_json(), nx=True)
    register_streams(pipe, keys, graph, priority)
    pipe.execute()
    script = lua.load_script(client, "start_once", _SCRIPTS)
    now = int(time.time() * 1000)
    flat = [part for pair in fields.items() for part in pair]
    return bool(script(keys=[keys.workflows, keys.lifecycle], args=[workflow_id, now, *flat]))


def terminate_workflow(
    client: redis.Redis, workflow_id: str, reason: str = "terminated", keys: Keys | None = None
) -> None:
    keys = keys or Keys()
    client.xadd(keys.lifecycle, encode_event(ev.terminate_workflow(workflow_id, reason)))  # type: ignore[arg-type]
