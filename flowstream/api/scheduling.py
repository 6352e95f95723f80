"""Routes for scheduling and flow control: schedules (``python -m lifecycle schedule``)
and concurrency limits per task kind (``python -m lifecycle limit``), through the same
functions as those commands. A schedule lives in its name's partition with its runs;
the kind limits under the base prefix, shared by every partition."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from flowlang.compiler import compile_text
from flowstream.api.bodies import LimitBody, ScheduleBody, body_of, check
from flowstream.api.context import Api, Operator, Reader, in_thread, json_body
from flowstream.api.problems import Problem
from lifecycle.engine.retention import parse_duration
from lifecycle.kind_limits import list_kind_limits, remove_kind_limit, set_kind_limit
from lifecycle.schedules import Schedule, Schedules, check_name

__all__ = ["router"]

router = APIRouter(prefix="/api", tags=["scheduling"])


@router.get("/schedules")
def get_schedules(api: Reader) -> dict[str, Any]:
    """Every schedule, its next fire time and last run: ``schedule list --json`` (by
    name, every partition's)."""
    rows = [row for place in api.places() for row in Schedules(place.redis, place.keys).describe()]
    return {"items": sorted(rows, key=lambda row: str(row["name"]))}


@router.post("/schedules", status_code=201, openapi_extra=body_of(ScheduleBody))
async def add_schedule(request: Request, api: Operator) -> dict[str, Any]:
    """Add a schedule (``schedule add``): 201 with its first run; 409 when the name is
    taken; a flow that does not compile is 400 with ``line`` and ``column``."""
    body = check(ScheduleBody, await json_body(request, api))
    return await in_thread(_add, api, body)


def _add(api: Api, body: ScheduleBody) -> dict[str, Any]:
    check_name(body.name)
    every_ms = None
    if body.every is not None:
        every_ms = round(parse_duration(body.every) * 1000)
    graph = compile_text(body.flow, f"schedule {body.name}", api.config.limits)
    spec = Schedule(
        name=body.name,
        graph=graph.content_hash(),
        flow=graph.name,
        file="(sent to the HTTP API)",
        cron=body.cron,
        every_ms=every_ms,
        timezone=body.timezone,
        overlap=body.overlap,
        catch_up=body.catch_up,
        input=body.input,
        priority=body.priority,
        concurrency_key=body.concurrency_key,
        max_running=body.max_running,
    )
    if body.concurrency_key is not None:
        # The runs live in the schedule's partition; the key's gate must be there too.
        api.partitions.check_placed(f"{{{spec.name}}}", body.concurrency_key)
    place = api.for_tag(spec.name)
    schedules = Schedules(place.redis, place.keys)
    if place.redis.exists(place.keys.schedule(body.name)):
        raise Problem(409, f"schedule {body.name!r} exists: remove it first")
    first = schedules.add(spec, graph)
    return {
        "name": spec.name,
        "schedule": spec.when,
        "first_run": schedules.run_id(spec.name, first),
    }


@router.post("/schedules/{name}/{action}", status_code=202)
def act_on_schedule(name: str, action: str, api: Operator) -> dict[str, Any]:
    """``pause``, ``resume`` or ``run-now`` (under the overlap policy: ``runs`` is empty
    when ``skip`` held it back); 404 for an unknown schedule."""
    check_name(name)
    place = api.for_tag(name)
    schedules = Schedules(place.redis, place.keys)
    if action == "pause":
        return {"name": name, "paused": True, "changed": schedules.pause(name)}
    if action == "resume":
        first = schedules.resume(name)
        return {
            "name": name,
            "paused": False,
            "changed": first is not None,
            "next_run": schedules.run_id(name, first) if first is not None else None,
        }
    if action == "run-now":
        fired = schedules.run_now(name)
        return {"name": name, "runs": list(fired.runs), "last": fired.last}
    raise Problem(404, f"action {action!r}: expected pause, resume or run-now")


@router.delete("/schedules/{name}")
def remove_schedule(name: str, api: Operator) -> dict[str, Any]:
    """Forget the schedule (its workflows stay); 404 for an unknown one."""
    place = api.for_tag(check_name(name))
    Schedules(place.redis, place.keys).remove(name)
    return {"name": name, "removed": True}


@router.get("/limits")
def get_limits(api: Reader) -> dict[str, Any]:
    """Every task kind with a limit, its slots held and tasks waiting: ``limit list``."""
    home = api.home
    return {"items": [limit.summary() for limit in list_kind_limits(home.redis, home.keys)]}


@router.put("/limits/{kind}", openapi_extra=body_of(LimitBody))
async def set_limit(kind: str, request: Request, api: Operator) -> dict[str, Any]:
    """At most ``limit`` tasks of ``kind`` run at once from now on (``limit set``)."""
    body = check(LimitBody, await json_body(request, api))
    home = api.home
    await in_thread(set_kind_limit, home.redis, home.keys, kind, body.limit)
    return {"kind": kind, "limit": body.limit}


@router.delete("/limits/{kind}")
def remove_limit(kind: str, api: Operator) -> dict[str, Any]:
    """Lift ``kind``'s limit (``limit remove``); 404 when it had none."""
    home = api.home
    if not remove_kind_limit(home.redis, home.keys, kind):
        raise Problem(404, f"kind {kind!r} has no limit")
    return {"kind": kind, "removed": True}
