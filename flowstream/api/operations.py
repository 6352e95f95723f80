"""Routes for the deployment as a whole: bulk actions by filter, dead letters, status,
and the console's session (its login)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from fastapi import APIRouter, Query, Request, Response

from flowstream.api.auth import COOKIE, Tokens, role_of
from flowstream.api.bodies import BulkBody, RequeueBody, SessionBody, body_of, check
from flowstream.api.context import Api, Operator, Place, Reader, Server, in_thread, json_body
from flowstream.api.problems import Problem
from lifecycle import events as ev
from lifecycle.client import Selection
from lifecycle.dead_letters import (
    DeadLetter,
    DeadLetterError,
    UnknownDeadLetter,
    find_dead_letter,
    list_dead_letters,
    requeue,
    sources,
)
from lifecycle.schedules import Schedules
from lifecycle.status import read_status

__all__ = ["router"]

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api", tags=["operations"])
REFUSALS_SHOWN = 100  # refused workflows listed in a bulk answer (all are counted)
_KINDS = {
    "terminate": ev.TERMINATE_WORKFLOW,
    "pause": ev.PAUSE_WORKFLOW,
    "resume": ev.RESUME_WORKFLOW,
    "restart": ev.RESTART_WORKFLOW,
    "delete": ev.DELETE_WORKFLOW,
}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def older_than_ms(value: str | float | None, now_ms: int) -> int | None:
    """The creation time (ms) before which ``older_than`` selects: seconds as a number,
    or text ``90s``, ``30m``, ``12h``, ``7d``."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", value)
        if found is None:
            raise Problem(
                400, f"filter.older_than {value[:40]!r}: expected seconds, or 30m, 12h, 7d"
            )
        seconds = float(found[1]) * _UNITS[found[2] or "s"]
    else:
        seconds = float(value)
    if not seconds >= 0 or seconds > 100 * 365 * 86400:
        raise Problem(400, f"filter.older_than {value!r}: expected 0 to 100 years of seconds")
    return now_ms - int(seconds * 1000)


@router.post("/actions", status_code=202, openapi_extra=body_of(BulkBody))
async def bulk_action(request: Request, api: Operator) -> dict[str, Any]:
    """Apply an action to every workflow the filter selects in every partition (sent
    pipelined, not waited for): how many matched, were sent, were already so, and which
    were refused (the counts of every partition summed)."""
    body = check(BulkBody, await json_body(request, api))
    given = body.filter
    if not (given.state or given.flow or given.schedule) and given.older_than in (None, ""):
        raise Problem(
            400, "filter: give state, flow, schedule or older_than (an action on every run?)"
        )
    states = (
        given.state if isinstance(given.state, str) or given.state is None else tuple(given.state)
    )
    before = older_than_ms(given.older_than, int(time.time() * 1000))
    selection = Selection(states or None, given.flow or None, before, given.schedule or None)
    kind = _KINDS[body.action]

    def act() -> dict[str, Any]:
        places = api.places()
        if selection.schedule is not None:  # an unknown schedule is a 404, not no match
            place = api.for_tag(selection.schedule)
            Schedules(place.redis, place.keys).get(selection.schedule)
            places = [place]  # a schedule's runs live in its partition
        # A terminate records its reason as the workflow's error, as the CLI's does.
        reason = body.reason or ("terminated" if body.action == "terminate" else "")
        matched = applied = 0
        refused: list[tuple[str, str]] = []
        for place in places:
            found = list(place.client.select(selection))
            sent, refusals = place.client.control_many(kind, found, reason)
            matched += len(found)
            applied += len(sent)
            refused += refusals
        return {
            "action": body.action,
            "matched": matched,
            "applied": applied,
            "already": matched - applied - len(refused),
            "refused": len(refused),
            "refusals": [{"id": i, "why": why} for i, why in refused[:REFUSALS_SHOWN]],
        }

    return await in_thread(act)


@router.get("/dead-letters", tags=["dead letters"])
def get_dead_letters(
    api: Reader,
    kind: str | None = Query(None, description="a task kind, or 'lifecycle'"),
    limit: int = Query(100, ge=1, le=10_000),
) -> dict[str, Any]:
    """What workers gave up on, oldest first per source (partition after partition),
    with the reason."""
    letters: list[DeadLetter] = []
    no_kind: DeadLetterError | None = None
    known = False
    for place in api.places():
        try:
            letters += list_dead_letters(
                place.redis, place.keys, kind or None, limit - len(letters)
            )
        except DeadLetterError as error:
            no_kind = error  # a kind whose tasks went to other partitions only
            continue
        known = True
        if len(letters) >= limit:
            break
    if not known and no_kind is not None:
        raise no_kind  # a kind no partition knows: 400 naming the known ones
    return {"items": [letter.summary() for letter in letters]}


@router.post("/dead-letters/requeue", tags=["dead letters"], openapi_extra=body_of(RequeueBody))
async def requeue_dead_letter(request: Request, api: Operator) -> dict[str, Any]:
    """Send a dead letter's entry again on its stream (``stream``: its source, a task kind
    or ``lifecycle``, or the stream's key) and remove it: ``new_id`` null when it was no
    longer there."""
    body = check(RequeueBody, await json_body(request, api))

    def act() -> dict[str, Any]:
        place, letter = find_letter(api, body.id, body.stream or None)
        done = requeue(place.redis, letter)
        return {"id": done.id, "source": done.source, "stream": done.stream, "new_id": done.new_id}

    return await in_thread(act)


def find_letter(api: Api, dead_id: str, stream: str | None) -> tuple[Place, DeadLetter]:
    """The dead letter ``dead_id`` and its partition, looked for in every partition (an
    entry id does not say which); ``stream``: its source (a task kind or ``lifecycle``)
    or its stream's key, which names one partition. 404 when no partition has it; 400
    when several do (entry ids are per stream: the stream's key tells them apart)."""
    found: list[tuple[Place, DeadLetter]] = []
    no_kind: DeadLetterError | None = None
    missing: UnknownDeadLetter | None = None
    for place in api.places():
        kind = stream
        if stream:
            known = dict((key, source) for source, key in sources(place.redis, place.keys))
            if api.several and stream.startswith(place.keys.prefix + ":") and stream not in known:
                continue  # a stream of another partition
            kind = known.get(stream, stream)
            if api.several:
                try:
                    sources(place.redis, place.keys, kind)
                except DeadLetterError as error:
                    no_kind = error  # a kind whose tasks went to other partitions only
                    continue
        try:
            found.append((place, find_dead_letter(place.redis, place.keys, dead_id, kind)))
        except UnknownDeadLetter as error:
            missing = error
    if len(found) == 1:
        return found[0]
    if found:
        where = ", ".join(place.keys.prefix for place, _ in found)
        raise Problem(
            400,
            f"dead letter {dead_id!r} is in several partitions ({where}): give its "
            "stream's key as 'stream'",
        )
    if missing is not None:
        raise missing
    if no_kind is not None:
        raise no_kind
    raise UnknownDeadLetter(f"no dead letter {dead_id!r} in stream {stream!r}")


@router.get("/status", tags=["operations"])
def get_status(api: Reader) -> dict[str, Any]:
    """Streams, workers, workflows by state and warnings: ``lifecycle status --json``;
    with several partitions, one such report per partition under ``partitions``, each
    with its ``prefix``."""
    places = api.places()
    if len(places) == 1:
        return read_status(places[0].redis, places[0].keys).to_dict()
    return {
        "partitions": [
            {"prefix": place.keys.prefix, **read_status(place.redis, place.keys).to_dict()}
            for place in places
        ]
    }


# The health check's own thread: the shared pool can be busy with heavy requests (large
# flows compiling, big workflows read) for longer than a probe waits, and a probe that
# queues behind them would take a busy server out of its load balancer.
_HEALTH = ThreadPoolExecutor(max_workers=1, thread_name_prefix="health")
HEALTH_TIMEOUT_S = 3.0


@router.get("/health", tags=["operations"])
async def get_health(api: Server) -> dict[str, Any]:
    """Readiness for a load balancer or an orchestrator: this server answers and reaches
    Redis (a PING to each partition's client within 3 s in all; 503 when one does
    not). Needs no token and shows nothing else; what the engine is doing is
    ``/api/status``."""

    def ping_each() -> None:
        for place in api.places():
            place.redis.ping()

    ping = asyncio.get_running_loop().run_in_executor(_HEALTH, ping_each)
    try:
        await asyncio.wait_for(ping, HEALTH_TIMEOUT_S)
    except (redis.RedisError, TimeoutError) as error:
        log.warning("health: Redis: %s", error or "no answer in time")
        raise Problem(503, "Redis does not answer") from None  # (its address stays here)
    return {"ok": True}


@router.post("/session", status_code=204, tags=["session"], openapi_extra=body_of(SessionBody))
async def log_in(request: Request, api: Server) -> Response:
    """The console's login: a valid token becomes the ``flowstream_session`` cookie
    (HttpOnly, SameSite=Strict); 401 for an unknown one."""
    body = check(SessionBody, await json_body(request, api))
    tokens: Tokens | None = api.config.tokens
    response = Response(status_code=204)
    if tokens is None:
        return response  # no authentication: nothing to remember
    if tokens.role(body.token) is None:
        # Who tried, never what: the token is not logged.
        log.warning("login refused from %s: unknown token", getattr(request.client, "host", "?"))
        raise Problem(401, "the token is not one this server knows")
    response.set_cookie(
        COOKIE,
        body.token,
        httponly=True,
        samesite="strict",
        path="/",
        # Behind a TLS-terminating proxy the scheme is its header's: marking the cookie
        # Secure when a caller claims HTTPS can only keep it off plain HTTP.
        secure="https" in (request.url.scheme, request.headers.get("x-forwarded-proto")),
    )
    return response


@router.get("/session", tags=["session"])
def get_session(request: Request) -> dict[str, Any]:
    """Who the caller is: ``role`` (read or operate) and whether the server checks tokens."""
    api: Api = request.app.state.api
    return {"role": role_of(request, api.config.tokens), "auth": api.config.tokens is not None}


@router.delete("/session", status_code=204, tags=["session"])
def log_out() -> Response:
    """Forget the session cookie."""
    response = Response(status_code=204)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response
