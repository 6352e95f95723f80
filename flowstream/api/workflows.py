"""Routes of workflows: start (JSON or upload), check a flow, list, one workflow, its
graph and history, and the controls. Each calls the engine's client or readers,
the same the CLI calls."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, Request, UploadFile

from flowlang.compiler import compile_text
from flowlang.graph import Graph
from flowlang.limits import loads_value
from flowstream.api.bodies import (
    ActionBody,
    AppliedAnswer,
    CheckBody,
    Checked,
    GraphAnswer,
    Listing,
    StartBody,
    Started,
    Workflow,
    answer,
    body_of,
    check,
)
from flowstream.api.context import Api, Operator, Reader, in_thread, json_body
from flowstream.api.listing import list_workflows_page
from flowstream.api.problems import Problem
from flowstream.api.views import graph_view, workflow_view
from lifecycle.client import Applied
from lifecycle.history import inspected, live_history
from lifecycle.inspect import LIST_STATES
from lifecycle.submit import BadConcurrency, check_concurrency, graph_task_kinds, new_workflow_id

__all__ = ["router", "start"]

router = APIRouter(prefix="/api", tags=["workflows"])
MAX_LIST = 1000  # rows one list page may ask for
MAX_ID = 200  # characters of a workflow id given by the caller
START_WAIT_S = 2.0  # a start waits this long at most for its record to exist


@router.post(
    "/workflows",
    status_code=201,
    openapi_extra=body_of(StartBody),
    responses=answer(Started, 201),
)
async def start_workflow(request: Request, api: Operator) -> dict[str, str]:
    """Compile the flow text and start it with ``input``: 201 ``{"id"}``; a flow that does
    not compile is 400 with ``line`` and ``column``; a taken ``id`` 409."""
    raw = await json_body(request, api)
    if isinstance(raw, dict) and "name" in raw and "flow" not in raw:
        raise Problem(
            400, "body.name: this deployment stores no flows by name; send the text as 'flow'"
        )
    body = check(StartBody, raw)
    gate = {"concurrency_key": body.concurrency_key, "max_running": body.max_running}
    started = await in_thread(
        start, api, body.flow, "flow", body.input, body.id, body.priority, **gate
    )
    return {"id": started}


@router.post("/workflows/upload", status_code=201, responses=answer(Started, 201))
async def upload_workflow(
    api: Operator,
    file: Annotated[UploadFile, File(description="the .flow file")],
    input: str | None = Form(None, description="the workflow's input as JSON text"),
    id: str | None = Form(None, description="the workflow id (default: a new one)"),
    priority: int = Form(0, description="the workflow's priority, -9 to 9"),
    concurrency_key: str | None = Form(None, description="with max_running"),
    max_running: int | None = Form(None, description="with concurrency_key"),
) -> dict[str, str]:
    """Start an uploaded ``.flow`` file (multipart ``file``, ``input`` JSON text): 201."""
    limits = api.config.limits
    name = file.filename or "upload.flow"
    data = await file.read(limits.flow_bytes + 1)
    if len(data) > limits.flow_bytes:
        raise Problem(413, f"{name}: more than the limit of {limits.flow_bytes:,} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise Problem(400, f"{name}: not UTF-8 text (byte at offset {error.start})") from None
    value = loads_value(input, limits, "input") if input else None
    gate = {"concurrency_key": concurrency_key or None, "max_running": max_running}
    return {"id": await in_thread(start, api, text, name, value, id, priority, **gate)}


def start(
    api: Api,
    text: str,
    name: str,
    value: Any,
    workflow_id: str | None,
    priority: int = 0,
    concurrency_key: str | None = None,
    max_running: int | None = None,
) -> str:
    """Compile ``text`` and start it through the client (once, for a given id) in its
    partition; wait up to :data:`START_WAIT_S` for a lifecycle worker to record it, so
    that the id answered can be read at once (it is answered all the same when none
    does in time). With several partitions a new id is chosen here, in the concurrency
    key's partition when there is one (the id says the partition); a given id under a
    concurrency key must live in the key's partition (400 naming the rule)."""
    graph = compile_text(text, name, api.config.limits)
    try:
        check_concurrency(concurrency_key, max_running)
    except BadConcurrency as error:
        raise Problem(400, f"body.concurrency_key/max_running: {error}") from None
    limits = api.config.limits
    if workflow_id is None:
        partitions = api.partitions
        chosen = None
        if partitions.count > 1:
            chosen = partitions.place(new_workflow_id(graph), concurrency_key)
        place = api.for_workflow(chosen) if chosen is not None else api.places()[0]
        workflow_id = place.client.submit(
            graph,
            value,
            chosen,
            limits=limits,
            priority=priority,
            concurrency_key=concurrency_key,
            max_running=max_running,
        )
    elif not workflow_id.strip():
        raise Problem(400, "body.id: empty; leave it out for a new id")
    elif workflow_id in ("stream", ".", ".."):
        # GET /api/workflows/stream is the list's event stream; a browser resolves the
        # dot segments of a path away, so such a workflow could not be addressed.
        raise Problem(400, f"body.id {workflow_id!r}: not a name its routes can address")
    elif "/" in workflow_id or not workflow_id.isprintable() or len(workflow_id) > MAX_ID:
        # Its routes could not name it: /api/workflows/{id} is one path segment.
        shown = repr(workflow_id[:40])
        raise Problem(400, f"body.id {shown}: expected {MAX_ID} printable characters at most, no /")
    else:
        api.partitions.check_placed(workflow_id, concurrency_key)
        place = api.for_workflow(workflow_id)
        if not place.client.submit_once(
            graph,
            value,
            workflow_id,
            limits,
            priority=priority,
            concurrency_key=concurrency_key,
            max_running=max_running,
        ):
            raise Problem(409, f"workflow {workflow_id} exists (or its start is not applied yet)")
    place = api.for_workflow(workflow_id)
    deadline = time.monotonic() + START_WAIT_S
    while not place.client.exists(workflow_id) and time.monotonic() < deadline:
        time.sleep(0.01)
    return workflow_id


@router.post("/flows/check", openapi_extra=body_of(CheckBody), responses=answer(Checked))
async def check_flow(request: Request, api: Reader) -> dict[str, Any]:
    """Compile the flow text without starting it: ``ok``, ``nodes``, ``kinds`` (the task
    kinds a worker must serve); 400 with ``line`` and ``column`` when it does not."""
    body = check(CheckBody, await json_body(request, api))
    graph: Graph = await in_thread(compile_text, body.flow, "flow", api.config.limits)
    return {
        "ok": True,
        "name": graph.name,
        "nodes": len(graph.nodes),
        "kinds": sorted(graph_task_kinds(graph)),
    }


@router.get("/workflows", responses=answer(Listing))
def list_workflows(
    api: Reader,
    state: str | None = Query(None, description=f"one of {', '.join(LIST_STATES)}"),
    flow: str | None = Query(None, description="the flow's name"),
    schedule: str | None = Query(None, description="the schedule that started it"),
    limit: int = Query(50, ge=1, le=MAX_LIST),
    cursor: str | None = Query(None, description="the 'next' of the previous page"),
) -> dict[str, Any]:
    """Workflows newest first, a page at a time: ``items`` and ``next`` (the cursor of
    the following page, null at the end), every partition's merged."""
    state = state or None
    if state is not None and state not in LIST_STATES:
        raise Problem(400, f"state {state!r}: expected one of {', '.join(LIST_STATES)}")
    items, following = list_workflows_page(
        api, state, flow or None, limit, cursor or None, schedule or None
    )
    return {"items": items, "next": following}


@router.get("/workflows/{workflow_id}", responses=answer(Workflow))
def get_workflow(workflow_id: str, api: Reader) -> dict[str, Any]:
    """One workflow as ``inspect --json`` shows it, plus ``nodes``; 404 for an unknown id."""
    place = api.for_workflow(workflow_id)
    return workflow_view(inspected(place.redis, place.keys, workflow_id, place.graphs))


@router.get("/workflows/{workflow_id}/graph", responses=answer(GraphAnswer))
def get_graph(workflow_id: str, api: Reader) -> dict[str, Any]:
    """The workflow's graph: ``nodes`` (id, label, kind, state) and ``edges`` (from, to)."""
    place = api.for_workflow(workflow_id)
    data = workflow_view(inspected(place.redis, place.keys, workflow_id, place.graphs))
    if not data["graph"]:
        return {"nodes": [], "edges": []}  # terminated before it started
    return graph_view(place.graphs.machine(data["graph"]).graph, data)


@router.get("/workflows/{workflow_id}/history")
def get_history(workflow_id: str, api: Reader) -> dict[str, Any]:
    """The workflow's timeline as ``history --json`` gives it, under ``events``; the part
    no longer in Redis is read from the server's ``--archive`` when it has one."""
    place = api.for_workflow(workflow_id)
    archive = api.config.archive
    if archive is not None:  # each partition is archived in its own directory
        archive = str(api.partitions.archive(archive, api.partitions.index_of(workflow_id)))
    data = live_history(place.redis, place.keys, workflow_id, archive)
    data["events"] = data.pop("timeline")
    return data


def _applied(applied: Applied) -> dict[str, Any]:
    return {
        "id": applied.workflow,
        "applied": applied.event_id is not None,
        "event": applied.event_id,
        "before": applied.before,
        "state": applied.state,
    }


async def _control(request: Request, api: Api, action: str, workflow_id: str) -> dict[str, Any]:
    body = check(ActionBody, await json_body(request, api), required=False)
    client = api.for_workflow(workflow_id).client
    if action == "terminate":
        applied = await in_thread(client.terminate, workflow_id, body.reason or "terminated")
    else:
        applied = await in_thread(getattr(client, action), workflow_id)
    return _applied(applied)


_ACTION_BODY = body_of(ActionBody, required=False)
_APPLIED = answer(AppliedAnswer, 202)
_ACTION: dict[str, Any] = {"status_code": 202, "openapi_extra": _ACTION_BODY, "responses": _APPLIED}


@router.post("/workflows/{workflow_id}/terminate", **_ACTION)
async def terminate(workflow_id: str, request: Request, api: Operator) -> Any:
    """Stop the workflow (``reason`` kept as its error): 202; 409 when it has ended."""
    return await _control(request, api, "terminate", workflow_id)


@router.post("/workflows/{workflow_id}/pause", **_ACTION)
async def pause(workflow_id: str, request: Request, api: Operator) -> Any:
    """Hold the tasks it would start until resumed: 202; 409 unless it is running."""
    return await _control(request, api, "pause", workflow_id)


@router.post("/workflows/{workflow_id}/resume", **_ACTION)
async def resume(workflow_id: str, request: Request, api: Operator) -> Any:
    """Start what was held: 202; 409 unless it is paused."""
    return await _control(request, api, "resume", workflow_id)


@router.post("/workflows/{workflow_id}/restart", **_ACTION)
async def restart(workflow_id: str, request: Request, api: Operator) -> Any:
    """Run a failed or terminated workflow on: 202; 409 in another state."""
    return await _control(request, api, "restart", workflow_id)


@router.delete("/workflows/{workflow_id}", status_code=202, responses=_APPLIED)
async def delete(workflow_id: str, request: Request, api: Operator) -> Any:
    """Remove an ended workflow's record: 202; 409 while it runs."""
    return await _control(request, api, "delete", workflow_id)
