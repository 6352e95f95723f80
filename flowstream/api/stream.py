"""Server-sent events: one workflow as it changes, and the list as workflows change.

Each stream reads Redis a few times a second at most (:attr:`ApiConfig.poll_s`;
the list at most once a second) and reads the whole workflow only when its
record's version (``v``, moved by every commit) changed; the list re-reads its
first page only when a lifecycle stream has a new entry (a workflow's stream reads
its partition; the list's, every partition, or a schedule's alone). At most
:attr:`ApiConfig.max_streams` streams are open at once (503 beyond); a comment
line every 15 s keeps idle connections open through proxies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import redis
from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from flowstream.api.context import Api, Place, Reader, in_thread
from flowstream.api.listing import list_workflows_page
from flowstream.api.problems import Problem
from flowstream.api.views import workflow_view
from lifecycle import records as rec
from lifecycle.errors import UnknownWorkflow
from lifecycle.history import inspected
from lifecycle.inspect import LIST_STATES
from lifecycle.schedules import Schedules

__all__ = ["router"]

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api", tags=["events"])
KEEP_ALIVE_S = 15.0
LIST_POLL_S = 1.0  # the list is re-read at most this often
_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(name: str, data: Any, event_id: str | None = None) -> bytes:
    """One server-sent event: its name, its data as one line of JSON, and an id."""
    head = f"event: {name}\n" + (f"id: {event_id}\n" if event_id else "")
    return head.encode() + b"data: " + orjson.dumps(data) + b"\n\n"


def _workflow_event(
    api: Api, place: Place, workflow_id: str, version: bytes | None
) -> tuple[str, bytes]:
    """The workflow's state and its ``workflow`` event at ``version``, read and encoded
    once for every stream that follows it (a large workflow is megabytes of JSON)."""
    shared = (workflow_id, version)
    found = api.shared.get(shared) if version is not None else None
    if found is None:
        data = workflow_view(inspected(place.redis, place.keys, workflow_id, place.graphs))
        found = (data["state"], event("workflow", data, version.decode() if version else None))
        if version is not None:
            api.shared.put(shared, found)
    return found  # type: ignore[no-any-return]


def _open(api: Api) -> None:
    """503 when every open stream's place is taken (the place itself is taken when the
    stream starts: :func:`_streamed`)."""
    if api.streams_full:
        raise Problem(503, f"{api.config.max_streams} event streams are open: try again later")


async def _streamed(api: Api, source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``source``, holding one of the open streams' places while it runs. Taken here,
    where its release is sure to run, and atomically: a stream that lost the race for
    the last place past :func:`_open` ends at once with an ``error`` event. Redis failing
    ends a stream the same way (the client's EventSource reconnects later)."""
    if not api.stream_opened():
        yield event("error", {"detail": f"{api.config.max_streams} event streams are open"})
        return
    try:
        async for chunk in source:
            yield chunk
    except redis.RedisError as error:
        log.warning("event stream: Redis: %s", error)
        yield event("error", {"detail": "Redis is not answering: the stream ends"})
    finally:
        api.stream_closed()


@router.get("/workflows/stream", response_class=StreamingResponse)
async def stream_list(
    api: Reader,
    request: Request,
    state: str | None = Query(None, description=f"one of {', '.join(LIST_STATES)}"),
    flow: str | None = Query(None),
    schedule: str | None = Query(None, description="the schedule that started them"),
    limit: int = Query(50, ge=1, le=1000),
) -> StreamingResponse:
    """``text/event-stream``: an event ``workflows`` (the list's first page, as ``GET
    /api/workflows`` gives it) at once and after each change."""
    state = state or None
    if state is not None and state not in LIST_STATES:
        raise Problem(400, f"state {state!r}: expected one of {', '.join(LIST_STATES)}")
    places = await in_thread(api.places)
    if schedule:  # an unknown schedule is a 404, not an empty list
        place = await in_thread(api.for_tag, schedule)
        await in_thread(Schedules(place.redis, place.keys).get, schedule)
        places = [place]  # its runs live in its partition
    _open(api)

    def mark() -> Any:
        return [
            (p.redis.xrevrange(p.keys.lifecycle, count=1), p.redis.zcard(p.keys.workflows))
            for p in places
        ]

    async def changes() -> AsyncIterator[bytes]:
        last: Any = None
        beat = time.monotonic()
        while not await request.is_disconnected():
            now = await in_thread(mark)
            if now != last:
                items, following = await in_thread(
                    list_workflows_page, api, state, flow or None, limit, None, schedule or None
                )
                yield event("workflows", {"items": items, "next": following})
                last, beat = now, time.monotonic()
            elif time.monotonic() - beat > KEEP_ALIVE_S:
                yield b": keep-alive\n\n"
                beat = time.monotonic()
            await asyncio.sleep(max(api.config.poll_s, LIST_POLL_S))

    return StreamingResponse(
        _streamed(api, changes()), media_type="text/event-stream", headers=_HEADERS
    )


@router.get("/workflows/{workflow_id}/stream", response_class=StreamingResponse)
async def stream_workflow(workflow_id: str, request: Request, api: Reader) -> StreamingResponse:
    """``text/event-stream``: an event ``workflow`` (as ``GET /api/workflows/{id}``) at
    once and after each change, the last once it has ended; ``gone`` if it is deleted
    meanwhile. 404 for an unknown id."""
    place = await in_thread(api.for_workflow, workflow_id)
    key = place.keys.workflow(workflow_id)
    # The version is read before the record: a commit in between is seen at the next poll.
    version = await in_thread(place.redis.hget, key, rec.VERSION)
    first = await in_thread(_workflow_event, api, place, workflow_id, version)
    _open(api)

    async def changes() -> AsyncIterator[bytes]:
        current: tuple[str, bytes] | None = first
        seen: Any = version  # the record's version as last read
        beat = time.monotonic()
        while True:
            if current is not None:
                state, chunk = current
                yield chunk
                beat = time.monotonic()
                if state in rec.ENDED_STATES:
                    return
            elif time.monotonic() - beat > KEEP_ALIVE_S:
                yield b": keep-alive\n\n"
                beat = time.monotonic()
            await asyncio.sleep(api.config.poll_s)
            if await request.is_disconnected():
                return
            now = await in_thread(place.redis.hget, key, rec.VERSION)
            current = None
            if now is None:
                yield event("gone", {"id": workflow_id})
                return
            if now != seen:
                try:
                    current = await in_thread(_workflow_event, api, place, workflow_id, now)
                except UnknownWorkflow:
                    yield event("gone", {"id": workflow_id})
                    return
                seen = now

    return StreamingResponse(
        _streamed(api, changes()), media_type="text/event-stream", headers=_HEADERS
    )
