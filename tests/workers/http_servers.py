"""Real HTTP servers on loopback addresses for the resource tests, each in a thread.

A :class:`Site` maps paths to behaviours (a body, a redirect, an endless or
dripping body) and records every request it received, so a test can assert
that a refused request never reached it.
"""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Behaviour = Callable[["_Handler"], None]


@dataclass
class Site:
    """What a test server answers, and what it was asked."""

    routes: dict[str, Behaviour] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    sent: int = 0  # body bytes written by endless/drip routes before the client left
    url: str = ""

    def paths(self) -> list[str]:
        return [path for _, path, _, _ in self.requests]


class _Handler(http.server.BaseHTTPRequestHandler):
    site: Site
    protocol_version = "HTTP/1.1"

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.site.requests.append((self.command, self.path, dict(self.headers), body))
        behaviour = self.site.routes.get(self.path)
        if behaviour is None:
            self.send_error(404, "Not Found")
            return
        with suppress(BrokenPipeError, ConnectionResetError):  # the client gave up: its choice
            behaviour(self)

    do_GET = do_PUT = do_POST = _handle  # noqa: N815 - http.server's names

    def log_message(self, *args: object) -> None:
        pass


def body(data: bytes, content_type: str = "application/json", status: int = 200) -> Behaviour:
    def answer(handler: _Handler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return answer


def redirect(location: str, status: int = 302) -> Behaviour:
    def answer(handler: _Handler) -> None:
        handler.send_response(status)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def endless(site: Site, declared: int | None = None) -> Behaviour:
    """A body that never ends (``declared``: a Content-Length to announce)."""

    def answer(handler: _Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if declared is not None:
            handler.send_header("Content-Length", str(declared))
        handler.send_header("Connection", "close")
        handler.end_headers()
        chunk = b" " * 65536
        while True:
            handler.wfile.write(chunk)
            site.sent += len(chunk)

    return answer


def drip(site: Site, interval: float, headers_too: bool = False) -> Behaviour:
    """One byte every ``interval`` seconds, forever: of the body, or of the headers too."""

    def answer(handler: _Handler) -> None:
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        )
        if not headers_too:
            handler.wfile.write(head)
            head = b""
        for byte in head + b" " * 100000:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            site.sent += 1
            time.sleep(interval)

    return answer


@contextmanager
def serve(site: Site, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> Iterator[Site]:
    """Serve ``site`` on ``host`` (any free port), over TLS with a ``tls`` server context;
    ``site.url`` is its base URL."""
    handler: Any = type("Handler", (_Handler,), {"site": site})
    server = http.server.ThreadingHTTPServer((host, 0), handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scheme = "https" if tls is not None else "http"
    site.url = f"{scheme}://{host}:{server.server_address[1]}"
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()


def self_signed(directory: Path, name: str = "localhost") -> tuple[Path, Path]:
    """(certificate, key) for ``name``, made by the openssl command line."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}",
         "-addext", f"subjectAltName=DNS:{name}"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context
