"""Throughput and latency of rqse next to the raw redis-py ceiling, same server, same run.

Measures, on one process:

(a) ceiling: raw redis-py, pre-encoded fields, pipelined XADD, then XREADGROUP
    COUNT <batch> and one XACK per batch - the least work Redis Streams allow;
(b) rqse: ``EventClient.append_many`` (encoding each event with orjson), then
    ``EventListener.listen`` (read, decode, ``process()``, acknowledge);
(c) latency: one event at a time, from just before XADD to the start of
    ``process()`` in a listener blocked in XREADGROUP, on an otherwise idle system.

Targets: (b) at least half of (a); (c) p50 under 2 ms.

Examples::

    python -m bench.rqse_throughput                       # private server, defaults
    python -m bench.rqse_throughput --events 200000 --batch 500
    python -m bench.rqse_throughput --redis-url redis://127.0.0.1:6379/15 --check

Exit codes: 0 done (with --check: targets met), 1 a target missed (--check), 2 usage.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis

from rqse import EventClient, EventListener, mask_url, message
from rqse.events import encode_event
from rqse.server import RedisServer

EXIT_OK, EXIT_TARGET_MISSED = 0, 1
STREAM, GROUP = "bench:events", "bench"


def sample_event(index: int) -> dict[str, Any]:
    """A start-task event of realistic shape (about 200 bytes on the wire)."""
    return message(
        {
            "workflow": "workflow:bench-2f1c",
            "name": "compute:step",
            "index": index,
            "input": {"path": "/data/in.csv", "rows": 1200},
            "parameters": {"for": 0},
        },
        kind="job",
    )


def raw_ceiling(client: redis.Redis, events: int, batch: int) -> float:
    """Events/s with raw redis-py: pipelined XADD, XREADGROUP COUNT batch, XACK per batch."""
    client.delete(STREAM)
    client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    fields = encode_event(sample_event(0))
    started = time.perf_counter()
    for offset in range(0, events, batch):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(batch, events - offset)):
            pipe.xadd(STREAM, fields)
        pipe.execute()
    done = 0
    while done < events:
        reply = client.xreadgroup(GROUP, "raw", {STREAM: ">"}, count=batch, block=1000)
        entries = reply[0][1]
        client.xack(STREAM, GROUP, *[entry_id for entry_id, _ in entries])
        done += len(entries)
    return events / (time.perf_counter() - started)


class Sink(EventListener):
    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        return True


def rqse_rate(url: str, events: int, batch: int) -> float:
    """Events/s through append_many -> listen -> process -> acknowledge."""
    with EventClient(STREAM, url=url) as client:
        client.delete_stream()
        listener = Sink(
            STREAM, GROUP, consumer="bench", url=url, batch_size=batch, handle_signals=False
        )
        prepared = [sample_event(i) for i in range(events)]
        started = time.perf_counter()
        for offset in range(0, events, batch):
            client.append_many(prepared[offset : offset + batch])
        handled = listener.listen(max_events=events)
        elapsed = time.perf_counter() - started
        listener.close()
    assert handled == events, f"handled {handled} of {events}"
    return events / elapsed


class Timed(EventListener):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.arrived = threading.Event()
        self.at = 0.0

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        self.at = time.perf_counter()
        self.arrived.set()
        return True


def latencies(url: str, samples: int) -> list[float]:
    """Seconds from before XADD to the start of process(), one event at a time."""
    with EventClient(STREAM, url=url) as client:
        client.delete_stream()
        listener = Timed(STREAM, GROUP, consumer="latency", url=url, handle_signals=False)
        thread = threading.Thread(target=listener.listen, daemon=True)
        thread.start()
        event = sample_event(0)
        result = []
        for index in range(samples + 50):  # the first 50 warm up
            while not listener._blocking:  # an idle system: the listener is waiting
                time.sleep(0.0002)
            listener.arrived.clear()
            sent = time.perf_counter()
            client.append(event)
            if not listener.arrived.wait(5):
                raise RuntimeError("an event was not processed within 5 s")
            if index >= 50:
                result.append(listener.at - sent)
        listener.stop()
        thread.join(10)
        listener.close()
    return result


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


@contextmanager
def server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with RedisServer() as private:
        yield private.url


def best_of(runs: int, measure: Callable[[], float]) -> float:
    return max(measure() for _ in range(runs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rqse_throughput",
        description=__doc__.split("\n\n")[0],
        epilog="Without --redis-url a private server is started on a free port and stopped "
        "after. With --redis-url the stream 'bench:events' there is overwritten.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--redis-url", help="use this server instead of a private one")
    parser.add_argument("--events", type=int, default=50_000, help="events per run (50000)")
    parser.add_argument("--batch", type=int, default=100, help="XADD/XREADGROUP batch (100)")
    parser.add_argument("--runs", type=int, default=3, help="throughput runs, best kept (3)")
    parser.add_argument("--samples", type=int, default=2000, help="latency samples (2000)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)

    with server(args.redis_url) as url:
        client = redis.Redis.from_url(url)
        info = client.info("server")
        version = info.get("valkey_version") or info.get("redis_version")
        ceiling = best_of(args.runs, lambda: raw_ceiling(client, args.events, args.batch))
        ours = best_of(args.runs, lambda: rqse_rate(url, args.events, args.batch))
        times = latencies(url, args.samples)
        client.delete(STREAM)
        client.close()

    ratio = ours / ceiling
    p50, p99 = percentile(times, 0.50) * 1000, percentile(times, 0.99) * 1000
    print(
        f"server {mask_url(url)} (version {version}); {args.events} events of "
        f"{sum(map(len, encode_event(sample_event(0)).values()))} value bytes, "
        f"batch {args.batch}, best of {args.runs}; {args.samples} latency samples"
    )
    rows = [
        ("raw redis-py ceiling (XADD, XREADGROUP, XACK)", f"{ceiling:,.0f} events/s"),
        ("rqse append_many -> listen -> process -> ack", f"{ours:,.0f} events/s"),
        ("rqse / ceiling (target >= 0.50)", f"{ratio:.2f}"),
        ("latency XADD -> process p50 (target < 2 ms)", f"{p50:.3f} ms"),
        ("latency XADD -> process p99", f"{p99:.3f} ms"),
        ("latency mean", f"{statistics.fmean(times) * 1000:.3f} ms"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value:>18}")
    met = ratio >= 0.5 and p50 < 2.0
    if args.check and not met:
        print("target missed", file=sys.stderr)
        return EXIT_TARGET_MISSED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
