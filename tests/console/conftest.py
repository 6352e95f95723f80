"""Browser fixtures: Debian's ``chromium`` driven by Playwright (no browser download), and a
plain HTTP server for the console's static files (layout checks that need no API)."""

from __future__ import annotations

import functools
import shutil
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

CONSOLE = Path(__file__).resolve().parents[2] / "flowstream" / "console"


def chromium_path() -> str:
    """The system Chromium; a clear failure naming the fix when it is missing."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no chromium on PATH: apt-get install -y chromium (.ci/run does this)")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright  # the test extra

    with sync_playwright() as playwright:
        # --no-sandbox: CI and containers run as root, where Chromium's sandbox cannot start.
        launched = playwright.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.errors = errors  # uncaught script errors, for tests to assert there are none
    requests: list[str] = []
    opened.on("request", lambda request: requests.append(request.url))
    opened.requests = requests  # every URL the page asked for (assets from elsewhere show)
    try:
        yield opened
    finally:
        context.close()


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


@pytest.fixture(scope="session")
def static_console() -> Iterator[str]:
    """URL of the console's files served as they are (no API behind them)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=CONSOLE))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
