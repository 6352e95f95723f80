"""Scraping a worker's ``--metrics-port`` over real HTTP, for the metrics tests."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def parse(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(port: int, timeout: float = 20.0) -> Samples:
    """The samples at ``http://127.0.0.1:port/metrics``, waiting for the server to be up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return parse(r.read().decode())
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def scrape_until(port: int, ready: Callable[[Samples], bool], timeout: float = 20.0) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(port)
        if ready(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def labels(**pairs: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(pairs.items()))


def events(samples: Samples, stream: str, group: str, outcome: str) -> float:
    return samples.get(
        ("flowstream_events_total", labels(group=group, outcome=outcome, stream=stream)), 0.0
    )
