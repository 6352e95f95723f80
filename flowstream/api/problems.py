"""Errors as RFC 9457 problem details (``application/problem+json``).

Every error the API answers is one JSON object: ``type``, ``title``, ``status``,
``detail`` (one line saying where and why) and, for a flow that does not
compile, ``line`` and ``column``. The engine's errors map to statuses here and
nowhere else, as the CLI maps them to exit codes in one place.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from flowlang.errors import FlowError
from lifecycle.dead_letters import UnknownDeadLetter
from lifecycle.errors import LifecycleError, NotAllowed, UnknownWorkflow
from lifecycle.schedules import UnknownSchedule

__all__ = ["PROBLEM_JSON", "Problem", "flow_problem", "install_handlers", "problem_response"]

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class Problem(Exception):
    """Raised by a route to answer with a problem: ``status`` and a one-line ``detail``;
    ``extra`` adds members (``line``, ``column``)."""

    def __init__(
        self, status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers
        self.extra = extra


def problem_response(
    status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    body = {
        "type": "about:blank",
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "detail": " ".join(detail.split()),
        **extra,
    }
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def flow_problem(error: FlowError) -> Problem:
    """A flow (or a value) that is refused: 400 naming the line and column when known."""
    if error.line:
        return Problem(400, str(error), line=error.line, column=error.column)
    return Problem(400, str(error))


def install_handlers(app: FastAPI) -> None:
    """Answer every error as a problem, without a traceback in the body."""

    @app.exception_handler(Problem)
    async def _problem(request: Request, error: Problem) -> JSONResponse:
        return problem_response(error.status, error.detail, error.headers, **error.extra)

    @app.exception_handler(FlowError)
    async def _flow(request: Request, error: FlowError) -> JSONResponse:
        problem = flow_problem(error)
        return problem_response(problem.status, problem.detail, **problem.extra)

    @app.exception_handler(LifecycleError)
    async def _lifecycle(request: Request, error: LifecycleError) -> JSONResponse:
        status = 400
        if isinstance(error, (UnknownWorkflow, UnknownDeadLetter, UnknownSchedule)):
            status = 404
        elif isinstance(error, NotAllowed):
            status = 409
        return problem_response(status, str(error))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        headers = dict(error.headers) if error.headers else None
        return problem_response(error.status_code, str(error.detail), headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()))
        return problem_response(400, f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(redis.RedisError)
    async def _redis(request: Request, error: redis.RedisError) -> JSONResponse:
        log.warning("%s %s: Redis: %s", request.method, request.url.path, error)
        return problem_response(503, f"Redis is not answering as it should: {error}")

    @app.exception_handler(Exception)
    async def _bug(request: Request, error: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=error)
        # What went wrong is in the server's log; the answer names only its kind.
        return problem_response(500, f"internal error, please report it: {type(error).__name__}")
