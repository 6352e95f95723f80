"""The API's application: routes under ``/api``, ``/openapi.json``, ``/docs``,
``/metrics``, and the console's static files at ``/`` when they are installed."""

from __future__ import annotations

import html
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flowstream.api import operations, scheduling, stream, workflows
from flowstream.api.auth import CSRF_HEADER, SAFE_METHODS, Tokens, role_of
from flowstream.api.context import BODY_SLACK, Api, ApiConfig
from flowstream.api.metrics import served_metrics
from flowstream.api.problems import Problem, install_handlers, problem_response

__all__ = ["create_app"]

LOGIN_BYTES = 4096  # the login's body: {"token": ...}

DESCRIPTION = """\
Start, watch and control flowstream workflows. Authenticate with
`Authorization: Bearer TOKEN` (a `read` token for GETs, an `operate` token for
starts and actions) or log in with `POST /api/session`. Errors are
`application/problem+json`; a flow that does not compile is 400 with `line` and
`column`.
"""


def create_app(config: ApiConfig) -> FastAPI:
    """The API for ``config``'s Redis and tokens (see :class:`ApiConfig`)."""
    app = FastAPI(
        title="flowstream",
        description=DESCRIPTION,
        version="1",
        docs_url=None,  # Swagger UI loads its assets from a CDN: /docs below is local
        redoc_url=None,
    )
    app.state.api = Api(config)
    install_handlers(app)
    app.include_router(stream.router)  # first: /workflows/stream before /workflows/{id}
    app.include_router(workflows.router)
    app.include_router(operations.router)
    app.include_router(scheduling.router)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        body, media = served_metrics(app.state.api)
        return Response(body, media_type=media)

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        # The page's one <style> element is inline: allowed here, and nothing else is.
        policy = CONTENT_SECURITY_POLICY.replace("style-src 'self'", "style-src 'unsafe-inline'")
        return HTMLResponse(
            reference_page(app.openapi()), headers={"Content-Security-Policy": policy}
        )

    limit = config.limits.flow_bytes + config.limits.value_bytes + BODY_SLACK
    app.add_middleware(BodyLimit, limit=limit, tokens=config.tokens)
    app.add_middleware(SecurityHeaders)
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_credentials=True,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", CSRF_HEADER],
        )
    if config.console_dir is not None and config.console_dir.is_dir():
        app.router.routes.append(
            ConsoleFiles("/", StaticFiles(directory=config.console_dir, html=True), name="console")
        )
    return app


class ConsoleFiles(Mount):
    """The console's files at ``/``, but never for an ``/api`` path: the routes' own
    answers hold there (a GET on a POST-only action is 405, an unknown one 404 as
    problem details) instead of the file server's 404."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        path = scope.get("path", "")
        if path == "/api" or path.startswith("/api/"):
            return Match.NONE, {}
        return super().matches(scope)


# The console loads only its own files and talks only to this origin; no page may frame it.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
_SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)


class SecurityHeaders:
    """Add the headers that keep a browser from running or framing what it should not, to
    every answer that does not set them itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(n, v) for n, v in _SECURITY_HEADERS if n not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


class BodyLimit:
    """Refuse a request body larger than any the API takes (413), counted as it arrives
    (a chunked body declares no length), and read no body at all from a caller without
    a valid token: a change under ``/api`` is authenticated before a route or the
    multipart parser reads a byte of it. The login's body is a token: a few kB at most.
    """

    def __init__(self, app: ASGIApp, limit: int, tokens: Tokens | None) -> None:
        self.app = app
        self.limit = limit
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        limit = LOGIN_BYTES if path == "/api/session" else self.limit
        refusal = self._refusal(scope, limit)
        changes = path.startswith("/api/") and method not in SAFE_METHODS
        if refusal is None and changes and path != "/api/session":
            try:
                role_of(Request(scope), self.tokens)
            except Problem as problem:
                refusal = problem
        if refusal is not None:
            await problem_response(refusal.status, refusal.detail, refusal.headers)(
                scope, receive, send
            )
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # An HTTPException passes FastAPI's body parsing as it is: a 413.
                    raise StarletteHTTPException(
                        413, f"the body is more than the limit of {limit:,} bytes"
                    )
            return message

        await self.app(scope, counted, send)

    @staticmethod
    def _refusal(scope: Scope, limit: int) -> Problem | None:
        for name, value in scope["headers"]:
            if name == b"content-length":
                size = int(value) if value.isdigit() else -1
                if size < 0:
                    return Problem(400, "Content-Length is not a number")
                if size > limit:
                    return Problem(
                        413, f"the body is {size:,} bytes, more than the limit of {limit:,}"
                    )
        return None


def reference_page(schema: dict[str, Any]) -> str:
    """A plain HTML reference of the API, made from its OpenAPI document (no script, no
    asset from elsewhere): each route with its summary, parameters and body."""
    esc = html.escape
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{esc(schema['info']['title'])} API</title>",
        "<style>body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;"
        "padding:0 1em}code{background:#f4f4f4;padding:0 .2em}h2{font-size:1.1em;"
        "margin-top:2em}</style></head><body>",
        f"<h1>{esc(schema['info']['title'])} HTTP API</h1>",
        f"<p>{esc(schema['info'].get('description', ''))}</p>",
        "<p>Machine-readable: <a href='/openapi.json'>/openapi.json</a>.</p>",
    ]
    for path, methods in schema.get("paths", {}).items():
        for method, operation in methods.items():
            parts.append(f"<h2><code>{esc(method.upper())} {esc(path)}</code></h2>")
            parts.append(
                f"<p>{esc(operation.get('description') or operation.get('summary', ''))}</p>"
            )
            params = operation.get("parameters", [])
            if params:
                parts.append("<ul>")
                for param in params:
                    name, where = esc(param["name"]), esc(param["in"])
                    about = esc(param.get("description", ""))
                    parts.append(f"<li><code>{name}</code> ({where}) {about}</li>")
                parts.append("</ul>")
            body = operation.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                fields = content.get("schema", {}).get("properties", {})
                names = ", ".join(f"<code>{esc(name)}</code>" for name in fields)
                parts.append(f"<p>body ({esc(media)}): {names}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)
