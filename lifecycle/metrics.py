"""The engine's Prometheus metrics, every name prefixed ``flowstream_``
(each documented in docs/operations.md).

* :class:`ProcessMetrics`: what one worker process serves on ``--metrics-port``: its
  listeners' events by outcome and its Redis round trips (:mod:`rqse.metrics`), plus
  the histograms its kind of worker observes (``advance_seconds`` here, the task
  workers' ``task_seconds`` in :mod:`workers.metrics`).
* :class:`StatusCollector`: stream length, lag, pending and dead letters, workflows by
  state, read from Redis when scraped with the readers ``lifecycle status`` uses
  (:mod:`lifecycle.status`), at most once a second. The lifecycle worker serves it,
  the task workers do not (one lifecycle worker is enough for a scrape; every one of
  them serving it costs a few commands per scrape each).
* :func:`metrics_text`: the text of the engine's collectors for a process that runs no
  worker (the HTTP API's ``/metrics``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import redis
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lifecycle.keys import Keys
from lifecycle.status import count_workflows, read_streams
from rqse.metrics import ListenerMetrics, MetricsServer, RoundTrips, serve

if TYPE_CHECKING:
    from lifecycle.audit.receipts import ReceiptsWorker
    from rqse import EventListener

__all__ = [
    "PARTITION_LABEL",
    "PartitionsCollector",
    "ADVANCE_BUCKETS",
    "CONTENT_TYPE",
    "PREFIX",
    "ProcessMetrics",
    "ReceiptsCollector",
    "StatusCollector",
    "metrics_text",
]

log = logging.getLogger(__name__)

PREFIX = "flowstream"
CONTENT_TYPE = CONTENT_TYPE_LATEST  # of metrics_text()'s bytes
#: Seconds one lifecycle batch (up to --batch-size events) spends in the advancer.
ADVANCE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
STATUS_TTL = 1.0  # seconds a scrape's reading of Redis serves the next scrapes
STATUS_COUNT_LIMIT = 10_000  # workflows counted per reading (the newest; ~0.07 s)


class ProcessMetrics:
    """The registry of one worker process. Construct it right after the process's
    connection pool and before anything uses that pool from another thread (round
    trips are counted by the pool's connections, which this replaces)."""

    def __init__(self, pool: redis.ConnectionPool | None = None) -> None:
        self.registry = CollectorRegistry()
        self.listeners = ListenerMetrics(PREFIX)
        self.round_trips = RoundTrips(PREFIX)
        self.registry.register(self.listeners)
        self.registry.register(self.round_trips)
        if pool is not None:
            self.round_trips.count(pool)
        self._histograms: dict[str, Histogram] = {}
        self.server: MetricsServer | None = None

    def watch(self, listener: EventListener) -> None:
        """Count ``listener``'s events by stream and outcome."""
        self.listeners.watch(listener)

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)

    def histogram(
        self, name: str, documentation: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> Histogram:
        """The histogram ``flowstream_<name>`` of this registry (made at the first call)."""
        found = self._histograms.get(name)
        if found is None:
            found = self._histograms[name] = Histogram(
                f"{PREFIX}_{name}",
                documentation,
                labelnames=tuple(labels),
                buckets=tuple(buckets),
                registry=self.registry,
            )
        return found

    def advance_seconds(self) -> Histogram:
        """``flowstream_advance_seconds``: the advancer's time per lifecycle batch."""
        return self.histogram(
            "advance_seconds",
            "Seconds the advancer took for one batch of lifecycle events (load, transition, "
            "commit)",
            ADVANCE_BUCKETS,
        )

    def serve(self, port: int, host: str) -> MetricsServer:
        """Start the HTTP endpoint (raises rqse ConfigurationError when it cannot)."""
        self.server = serve(self.registry, port, host)
        log.info("metrics on http://%s:%s/metrics", self.server.host, self.server.port)
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def text(self) -> bytes:
        return generate_latest(self.registry)


class StatusCollector(Collector):
    """The state of the engine in Redis, read when scraped and kept ``ttl`` seconds.

    Costs, per reading: a few commands per stream (XLEN, XINFO GROUPS, XINFO CONSUMERS
    per group, XLEN of its dead letters) and :func:`lifecycle.status.count_workflows`
    over the newest ``count_limit`` workflows (pipelined a thousand at a time). A
    reading Redis refuses yields ``flowstream_status_up 0`` and nothing else.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        *,
        ttl: float = STATUS_TTL,
        count_limit: int = STATUS_COUNT_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.keys = keys
        self.ttl = ttl
        self.count_limit = count_limit
        self.clock = clock
        self.readings = 0  # times Redis was read (the rest came from the cache)
        self._lock = threading.Lock()  # one reading at a time; scrapes meanwhile wait
        self._cached: list[Metric] = []
        self._read_at = float("-inf")

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if self.clock() - self._read_at >= self.ttl:
                self._cached = self._read()
                self._read_at = self.clock()
            metrics = self._cached
        yield from metrics

    def _read(self) -> list[Metric]:
        self.readings += 1
        started = time.perf_counter()
        up = GaugeMetricFamily(
            f"{PREFIX}_status_up", "1 when the last reading of Redis for these metrics worked"
        )
        try:
            streams = read_streams(self.client, self.keys)
            counts = count_workflows(self.client, self.keys, self.count_limit)
        except redis.RedisError as error:
            log.warning("metrics: reading the engine's state from Redis failed: %s", error)
            up.add_metric([], 0)
            return [up]
        up.add_metric([], 1)
        length = GaugeMetricFamily(
            f"{PREFIX}_stream_length", "Entries in the stream (XLEN)", labels=["stream"]
        )
        lag = GaugeMetricFamily(
            f"{PREFIX}_stream_lag",
            "Entries not yet delivered to the consumer group",
            labels=["stream", "group"],
        )
        pending = GaugeMetricFamily(
            f"{PREFIX}_stream_pending",
            "Entries delivered to the group and not acknowledged yet",
            labels=["stream", "group"],
        )
        oldest = GaugeMetricFamily(
            f"{PREFIX}_stream_oldest_waiting_seconds",
            "Age of the oldest entry not yet delivered to the group (0: none waiting)",
            labels=["stream", "group"],
        )
        consumers = GaugeMetricFamily(
            f"{PREFIX}_stream_consumers",
            "Consumers the group knows (alive or not: see lifecycle status)",
            labels=["stream", "group"],
        )
        dead = GaugeMetricFamily(
            f"{PREFIX}_dead_letters",
            "Entries in the stream's dead-letter stream (<stream>:dead)",
            labels=["stream"],
        )
        for info in streams:
            length.add_metric([info.stream], info.length)
            dead.add_metric([info.stream], info.dead_letters)
            for group in [info.group, *info.others]:
                if group is None:
                    continue
                labels = [info.stream, group.name]
                lag.add_metric(labels, group.lag)
                pending.add_metric(labels, group.pending)
                oldest.add_metric(labels, (group.oldest_waiting_ms or 0) / 1000)
                consumers.add_metric(labels, len(group.consumers))
        workflows = GaugeMetricFamily(
            f"{PREFIX}_workflows",
            "Workflows in Redis by state (of the newest ones counted: see "
            f"{PREFIX}_workflows_counted_partial)",
            labels=["state"],
        )
        for state, count in counts.states.items():
            workflows.add_metric([state], count)
        partial = GaugeMetricFamily(
            f"{PREFIX}_workflows_counted_partial",
            "1 when there were more workflows than the reading counts (the newest only)",
        )
        partial.add_metric([], int(counts.partial))
        ended = CounterMetricFamily(
            f"{PREFIX}_workflows_ended",
            "Workflows that ended since the engine started, by status ({flow}:outcomes)",
            labels=["status"],
        )
        for status, count in sorted(counts.ended_since_start.items()):
            ended.add_metric([status], count)
        took = GaugeMetricFamily(
            f"{PREFIX}_status_read_seconds", "Seconds the last reading of Redis took"
        )
        took.add_metric([], time.perf_counter() - started)
        return [up, length, lag, pending, oldest, consumers, dead, workflows, partial, ended, took]


class ReceiptsCollector(Collector):
    """The receipts worker's counters (``ReceiptsStats``), read when scraped."""

    _COUNTERS = (
        ("archived", "Engine stream entries written to the archive"),
        ("batches", "Batches archived"),
        ("trimmed", "Entries trimmed from the streams once archived"),
        ("refused_flushes", "Flushes the disk refused (retried)"),
        ("errors", "Unexpected errors the receipts loop backed off from"),
    )

    def __init__(self, worker: ReceiptsWorker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        stats = self.worker.stats
        for name, doc in self._COUNTERS:
            family = CounterMetricFamily(f"{PREFIX}_receipts_{name}", doc)
            family.add_metric([], getattr(stats, name))
            yield family


_api_registries: dict[tuple[int, str], CollectorRegistry] = {}
_API_REGISTRIES = 16  # (client, prefix) pairs kept; a caller passes its one long-lived client
_api_lock = threading.Lock()


def metrics_text(client: redis.Redis, keys: Keys) -> bytes:
    """The Prometheus text (:data:`CONTENT_TYPE`) of the engine's collectors, for a
    process that serves ``/metrics`` itself (the HTTP API): the
    :class:`StatusCollector` of ``client`` and ``keys``, one per pair kept for the
    life of the process, so its one-second cache holds across requests: pass the
    process's long-lived client, not one made per request."""
    key = (id(client), keys.prefix)
    with _api_lock:
        registry = _api_registries.get(key)
        if registry is None:
            if len(_api_registries) >= _API_REGISTRIES:  # a client per request: no cache
                _api_registries.clear()
            registry = CollectorRegistry()
            registry.register(StatusCollector(client, keys))
            _api_registries[key] = registry
    return generate_latest(registry)


PARTITION_LABEL = "partition"  # the label of every sample of one partition's figures


class PartitionsCollector(Collector):
    """The :class:`StatusCollector` of each partition, their families merged: one family
    per name (the text format allows no other), each sample with its partition's prefix
    as the ``partition`` label."""

    def __init__(self, places: Sequence[tuple[redis.Redis, Keys]]) -> None:
        self.collectors = [(keys.prefix, StatusCollector(client, keys)) for client, keys in places]

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for prefix, collector in self.collectors:
            for family in collector.collect():
                into = merged.get(family.name)
                if into is None:
                    into = Metric(family.name, family.documentation, family.type, family.unit)
                    merged[family.name] = into
                for sample in family.samples:
                    labels = {**sample.labels, PARTITION_LABEL: prefix}
                    into.samples.append(sample._replace(labels=labels))
        yield from merged.values()
