"""Prometheus metrics of listeners and of the Redis round trips a process makes.

Nothing here costs anything until asked for: a listener counts per stream only once
:meth:`ListenerMetrics.watch` gave it a ``stream_stats`` dict (and then adds up its
counters once per batch, never per entry), and round trips are counted only on a
pool :meth:`RoundTrips.count` was given. Both are collectors: they read those
counters when Prometheus scrapes, so the listener's thread takes no lock for them.

:func:`serve` starts the HTTP endpoint (``prometheus_client``'s, on a daemon thread)
and turns a port already taken into one :class:`rqse.errors.ConfigurationError` line.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from rqse.batch import ListenerStats
from rqse.errors import ConfigurationError

if TYPE_CHECKING:
    from rqse.listener import EventListener

__all__ = [
    "OUTCOMES",
    "ListenerMetrics",
    "MetricsServer",
    "RoundTrips",
    "metrics_arguments",
    "serve",
]

#: The outcomes of an entry, as ``ListenerStats`` names them: processed (process()
#: returned truthy), declined (falsy: "not mine"), ignored (kind not selected,
#: acknowledged unseen), failed (process() raised: left pending, retried),
#: dead_lettered (moved to ``<stream>:dead``).
OUTCOMES = ("processed", "declined", "ignored", "failed", "dead_lettered")

DEFAULT_HOST = "127.0.0.1"


class ListenerMetrics(Collector):
    """``<prefix>_events_total{stream, group, outcome}`` and
    ``<prefix>_events_received_total{stream, group}`` of the listeners it watches (the
    listeners of one stream and group in a process are added up), and
    ``<prefix>_listener_reconnects_total{group}``: Redis errors survived."""

    def __init__(self, prefix: str = "rqse") -> None:
        self._prefix = prefix
        self._listeners: list[EventListener] = []
        self._lock = threading.Lock()  # watch() may race a scrape; the hot path never takes it

    def watch(self, listener: EventListener) -> None:
        """Count ``listener``'s entries per stream from now on (its streams show at 0
        before their first entry, so rates and alerts have a series to start from)."""
        if listener.stream_stats is None:
            listener.stream_stats = {}
        for stream in listener.streams:
            listener.stream_stats.setdefault(stream, ListenerStats())
        with self._lock:
            self._listeners.append(listener)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            listeners = list(self._listeners)
        totals: dict[tuple[str, str], ListenerStats] = {}
        reconnects: dict[str, int] = {}
        for listener in listeners:
            group = listener.group
            reconnects[group] = reconnects.get(group, 0) + listener.stats.reconnects
            # A copy taken in one step: the loop thread may add a stream meanwhile.
            for stream, stats in list((listener.stream_stats or {}).items()):
                total = totals.setdefault((stream, group), ListenerStats())
                total.add_since((0,) * 6, stats)
        events = CounterMetricFamily(
            f"{self._prefix}_events",
            "Stream entries handled, by outcome (processed, declined, ignored, failed, "
            "dead_lettered)",
            labels=["stream", "group", "outcome"],
        )
        received = CounterMetricFamily(
            f"{self._prefix}_events_received",
            "Stream entries read (new, recovered or claimed), however they ended",
            labels=["stream", "group"],
        )
        for (stream, group), stats in sorted(totals.items()):
            received.add_metric([stream, group], stats.received)
            for outcome in OUTCOMES:
                events.add_metric([stream, group, outcome], getattr(stats, outcome))
        survived = CounterMetricFamily(
            f"{self._prefix}_listener_reconnects",
            "Transient Redis errors a listener backed off from and survived",
            labels=["group"],
        )
        for group, count in sorted(reconnects.items()):
            survived.add_metric([group], count)
        yield events
        yield received
        yield survived


class RoundTrips(Collector):
    """``<prefix>_redis_round_trips_total``: requests this process sent to Redis (one per
    command, pipeline or transaction sent together; a blocking read is one).

    Counted by each connection of the pools given to :meth:`count`, in its
    ``send_packed_command``: a connection serves one thread at a time, so a plain
    increment is exact without a lock. The counting connections are kept here for
    the scrape to add up (their number is bounded by the pool's).
    """

    def __init__(self, prefix: str = "rqse") -> None:
        self._prefix = prefix
        self._connections: list[Any] = []
        self._lock = threading.Lock()

    def count(self, pool: redis.ConnectionPool) -> None:
        """Count the round trips of ``pool``'s connections. Call it before the pool is
        shared with other threads: its idle connections are dropped, so that every
        connection it hands out from now on counts."""
        base = pool.connection_class
        if getattr(base, "_rqse_counted", False):
            return
        connections, lock = self._connections, self._lock

        class Counting(base):  # type: ignore[valid-type, misc]
            _rqse_counted = True
            sent = 0

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                with lock:
                    connections.append(self)

            def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                self.sent += 1
                super().send_packed_command(command, check_health)

        Counting.__name__ = Counting.__qualname__ = f"Counting{base.__name__}"
        pool.connection_class = Counting
        pool.reset()

    def total(self) -> int:
        """Round trips so far, every counted pool together."""
        with self._lock:
            connections = list(self._connections)
        return sum(c.sent for c in connections)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            f"{self._prefix}_redis_round_trips",
            "Requests sent to Redis (a command, or a pipeline or transaction sent at once)",
        )
        family.add_metric([], self.total())
        yield family


class MetricsServer:
    """The running HTTP endpoint: ``/metrics`` (and any path) answers the registry."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.host, self.port = server.server_address[:2]

    def stop(self) -> None:
        """Stop answering and free the port; idempotent."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
            self._thread.join(5)


def serve(registry: CollectorRegistry, port: int, host: str = DEFAULT_HOST) -> MetricsServer:
    """Serve ``registry`` in Prometheus text format on ``host:port`` (a daemon thread).

    Raises ConfigurationError when the address cannot be bound (port in use, no such
    address): one line naming it."""
    try:
        server, thread = start_http_server(port, host, registry)
    except OSError as error:
        reason = error.strerror or str(error)
        raise ConfigurationError(
            f"--metrics-port {port}: cannot serve metrics on {host}:{port}: {reason}"
        ) from None
    return MetricsServer(server, thread)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {port}")
    return port


def metrics_arguments(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--metrics-host``: without a port, no metrics at all."""
    parser.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics over HTTP on this port (default: none, and no "
        "counting beyond the listener's own)",
    )
    parser.add_argument(
        "--metrics-host",
        default=DEFAULT_HOST,
        metavar="HOST",
        help=f"address the metrics port binds (default {DEFAULT_HOST}; 0.0.0.0 for all)",
    )
