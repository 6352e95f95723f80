"""Shared pieces of the receipts and replay tests: a flow with every feature, a run, checks."""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis

from flowlang.compiler import compile_text
from flowlang.runner import TaskCall
from lifecycle.audit.archive import id_order, read_archive
from lifecycle.audit.receipts import ReceiptsWorker
from lifecycle.audit.segments import SegmentSink
from lifecycle.keys import Keys
from tests.lifecycle.harness import Harness

KEYS = Keys()

# Joins (:x/:y into D), iteration (* { }), a guard (? ...), a parallel pair (F|G), and
# $retries on every task so that random failures are retried.
FLOW = """
@task A (- $retries: 4 -)
@task B (- $retries: 4 -)
@task C (- $retries: 4 -)
@task D (- $retries: 4 -)
@task E (- $retries: 4 -)
@task F (- $retries: 4 -)
@task G (- $retries: 4 -)
A :x → * { B → ? `$[?(@.size>4)]` C } → :y D; :x → E → :y; D → F|G
"""


def flow_input(n: int) -> list[dict[str, int]]:
    return [{"i": n, "size": (n + k) % 9} for k in range(3)]


def flaky(call: TaskCall) -> Any:
    """Output = input plus the task's name; fails first attempts now and then, the same
    ones every run (a digest of name, input and attempt decides)."""
    digest = hashlib.sha256(repr((call.name, call.input, call.attempt)).encode()).digest()
    if call.attempt <= 2 and digest[0] < 40:
        raise RuntimeError(f"flaky {call.name} attempt {call.attempt}")
    value = call.input
    if isinstance(value, dict):
        return {**value, "done": [*value.get("done", []), call.name]}
    return value


def run_in_harness(client: redis.Redis, count: int) -> list[str]:
    harness = Harness(client, KEYS)
    graph = compile_text(FLOW)
    ids = [harness.submit(graph, flow_input(n), f"w{n}") for n in range(count)]
    harness.pump(flaky)
    return ids


def archive_all(
    client: redis.Redis, directory: Path, batch_size: int = 1000, **options: Any
) -> ReceiptsWorker:
    """Run a receipts worker until the streams have been idle for a moment."""
    sink = SegmentSink(directory, **options)
    worker = ReceiptsWorker(client, sink, KEYS, batch_size=batch_size, block_ms=50, trim_every=None)
    try:
        worker.run(idle_timeout=0.3)
    finally:
        sink.close()
    return worker


def archived_ids(directory: Path) -> dict[str, list[str]]:
    """Entry ids per stream, in archive order."""
    found: dict[str, list[str]] = defaultdict(list)
    for _, record in read_archive(directory):
        if "stream" in record:
            found[record["stream"]].append(record["id"])
    return found


def engine_streams(client: redis.Redis) -> list[str]:
    kinds = sorted(k.decode() for k in client.smembers(KEYS.kinds))
    bases = [KEYS.lifecycle] + [KEYS.tasks(kind) for kind in kinds]
    return [s for b in bases for s in (b, b + ":dead") if client.exists(s)]


def assert_exactly_once(client: redis.Redis, directory: Path) -> dict[str, int]:
    """Per stream: no duplicate, ids increasing, as many as Redis ever added, and every
    entry Redis still holds archived with the same fields. Returns counts per stream."""
    archived = archived_ids(directory)
    counts = {}
    for stream in engine_streams(client):
        ids = archived.get(stream, [])
        duplicates = [i for i, n in Counter(ids).items() if n > 1]
        assert not duplicates, f"{stream}: archived twice: {duplicates[:3]}"
        assert ids == sorted(ids, key=id_order), f"{stream}: archive out of id order"
        added = client.xinfo_stream(stream)["entries-added"]
        assert len(ids) == added, f"{stream}: {len(ids)} archived, Redis added {added}"
        held = [i.decode() for i, _ in client.xrange(stream)]
        missing = set(held) - set(ids)
        assert not missing, f"{stream}: not archived: {sorted(missing)[:3]}"
        counts[stream] = len(ids)
    return counts


def rewrite(directory: Path, change: Any) -> None:
    """Apply ``change(lines) -> lines`` to the archive's (single, plain) segment."""
    (segment,) = sorted(directory.glob("segment-*.jsonl"))
    lines = segment.read_bytes().splitlines()
    segment.write_bytes(b"\n".join(change(lines)) + b"\n")


def find_line(lines: list[bytes], predicate: Any) -> int:
    import orjson

    for number, line in enumerate(lines):
        if predicate(orjson.loads(line)):
            return number
    pytest.fail("no such record in the archive")
