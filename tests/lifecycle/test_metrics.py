"""--metrics-port on real worker processes, scraped over real HTTP, and the scrape-time
collector of the engine's state against real Redis."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import redis
from prometheus_client import CollectorRegistry, generate_latest
from redis.backoff import NoBackoff
from redis.retry import Retry

from flowlang.compiler import compile_text
from lifecycle.keys import Keys
from lifecycle.metrics import StatusCollector, metrics_text
from lifecycle.submit import start_workflow
from tests.processes import Processes, wait_until_all_ended
from tests.scrape import Samples, events, free_port, labels, parse, scrape_until

KEYS = Keys()
FLOW = "A → B"  # two tasks of the default kind per workflow
WORKFLOWS = 20


def test_worker_processes_serve_events_latencies_round_trips_and_engine_state(
    processes: Processes, redis_client: redis.Redis
) -> None:
    lifecycle_port, worker_port = free_port(), free_port()
    processes.start(
        "lifecycle",
        "worker",
        "--no-wait",
        "--consumer",
        "lc",
        "--metrics-port",
        str(lifecycle_port),
    )
    processes.start(
        "workers",
        "simulate",
        "--kinds",
        "default",
        "--delay-max",
        "0.01",
        "--metrics-port",
        str(worker_port),
    )
    # Once listening: it connected and reads (a scrape may come before).
    before = scrape_until(
        lifecycle_port, lambda s: s[("flowstream_redis_round_trips_total", ())] > 0
    )
    assert before[("flowstream_redis_round_trips_total", ())] > 0
    graph = compile_text(FLOW)
    ids = [start_workflow(redis_client, graph, {"n": n}, f"w{n}") for n in range(WORKFLOWS)]
    wait_until_all_ended(redis_client, ids, timeout=60)

    def lifecycle_caught_up(samples: Samples) -> bool:
        sent = redis_client.xlen(KEYS.lifecycle)
        finished = samples.get(("flowstream_workflows", labels(state="finished")))
        # The engine's state is read at most once a second: it may lag a scrape behind.
        processed = events(samples, KEYS.lifecycle, "lifecycle", "processed")
        return processed == sent and finished == WORKFLOWS

    after = scrape_until(lifecycle_port, lifecycle_caught_up)
    # Every lifecycle event sent (start-workflow, end-tasks, end-workflows) was processed.
    sent = redis_client.xlen(KEYS.lifecycle)
    assert sent == WORKFLOWS * 4
    assert events(after, KEYS.lifecycle, "lifecycle", "processed") == sent
    assert events(after, KEYS.lifecycle, "lifecycle", "dead_lettered") == 0
    batches = after[("flowstream_advance_seconds_count", ())]
    assert 1 <= batches <= sent  # one observation per batch, not per event
    assert after[("flowstream_advance_seconds_sum", ())] > 0
    assert after[("flowstream_advance_seconds_bucket", labels(le="+Inf"))] == batches
    trips = after[("flowstream_redis_round_trips_total", ())]
    assert trips > before[("flowstream_redis_round_trips_total", ())] + batches

    # Read from Redis at scrape time: nothing waits, every workflow finished.
    assert after[("flowstream_status_up", ())] == 1
    assert after[("flowstream_workflows", labels(state="finished"))] == WORKFLOWS
    assert after[("flowstream_workflows", labels(state="running"))] == 0
    assert after[("flowstream_workflows_ended_total", labels(status="finished"))] == WORKFLOWS
    tasks = KEYS.tasks("default")
    assert after[("flowstream_stream_length", labels(stream=tasks))] == WORKFLOWS * 2
    assert after[("flowstream_stream_lag", labels(group="workers", stream=tasks))] == 0
    assert after[("flowstream_stream_pending", labels(group="workers", stream=tasks))] == 0
    assert after[("flowstream_dead_letters", labels(stream=tasks))] == 0

    worker = scrape_until(
        worker_port, lambda s: events(s, tasks, "workers", "processed") == WORKFLOWS * 2
    )
    assert events(worker, tasks, "workers", "processed") == WORKFLOWS * 2
    run = worker[("flowstream_task_seconds_count", labels(kind="default"))]
    assert run == WORKFLOWS * 2
    assert 0 < worker[("flowstream_task_seconds_sum", labels(kind="default"))] < run * 0.5
    assert ("flowstream_status_up", ()) not in worker  # the engine's state: lifecycle only


def test_a_failing_task_is_counted_as_dead_letter_of_its_stream(
    processes: Processes, redis_client: redis.Redis
) -> None:
    """A start-task dead-lettered by the task worker shows on the worker's metrics and,
    as a dead letter of the kind's stream, on the lifecycle worker's."""
    port = free_port()
    processes.start("lifecycle", "worker", "--no-wait", "--metrics-port", str(port))
    redis_client.xadd(KEYS.tasks("default"), {"kind": "not json"})
    redis_client.sadd(KEYS.kinds, "default")
    worker_port = free_port()
    processes.start("workers", "noop", "--kinds", "default", "--metrics-port", str(worker_port))
    tasks = KEYS.tasks("default")
    worker = scrape_until(worker_port, lambda s: events(s, tasks, "workers", "dead_lettered") == 1)
    assert events(worker, tasks, "workers", "dead_lettered") == 1
    engine = scrape_until(
        port, lambda s: s.get(("flowstream_dead_letters", labels(stream=tasks))) == 1
    )
    assert engine[("flowstream_dead_letters", labels(stream=tasks))] == 1


def test_status_collector_reads_lag_dead_letters_and_states_and_caches_a_second(
    redis_client: redis.Redis,
) -> None:
    graph = compile_text(FLOW)
    for n in range(5):
        start_workflow(redis_client, graph, {"n": n}, f"w{n}")
    redis_client.xgroup_create(KEYS.lifecycle, "lifecycle", id="0", mkstream=True)
    redis_client.xadd(f"{KEYS.lifecycle}:dead", {"reason": '"x"'})
    now = [100.0]
    collector = StatusCollector(redis_client, KEYS, clock=lambda: now[0])
    registry = CollectorRegistry()
    registry.register(collector)
    samples = parse(generate_latest(registry).decode())
    lifecycle = labels(group="lifecycle", stream=KEYS.lifecycle)
    assert samples[("flowstream_stream_lag", lifecycle)] == 5
    assert samples[("flowstream_stream_pending", lifecycle)] == 0
    assert samples[("flowstream_stream_oldest_waiting_seconds", lifecycle)] >= 0
    assert samples[("flowstream_dead_letters", labels(stream=KEYS.lifecycle))] == 1
    assert collector.readings == 1

    redis_client.xadd(KEYS.lifecycle, {"kind": '"x"'})
    now[0] += 0.5  # within the second: the same reading
    samples = parse(generate_latest(registry).decode())
    assert samples[("flowstream_stream_lag", lifecycle)] == 5 and collector.readings == 1
    now[0] += 0.6
    samples = parse(generate_latest(registry).decode())
    assert samples[("flowstream_stream_lag", lifecycle)] == 6 and collector.readings == 2


def test_status_collector_says_down_when_redis_refuses(redis_url: str) -> None:
    client = redis.Redis(
        host="127.0.0.1", port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    registry = CollectorRegistry()
    registry.register(StatusCollector(client, KEYS))
    samples = parse(generate_latest(registry).decode())
    assert samples == {("flowstream_status_up", ()): 0.0}


def test_metrics_text_is_the_engine_state_for_the_api(redis_client: redis.Redis) -> None:
    start_workflow(redis_client, compile_text(FLOW), {}, "w0")
    text = metrics_text(redis_client, KEYS).decode()
    samples = parse(text)
    assert samples[("flowstream_status_up", ())] == 1
    assert samples[("flowstream_stream_length", labels(stream=KEYS.lifecycle))] == 1


def test_a_metrics_port_in_use_stops_each_worker_command_with_one_line(
    redis_url: str, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for command in (
            ("lifecycle", "worker", "--no-wait"),
            ("lifecycle", "receipts", "--archive", str(tmp_path / "archive")),
            ("workers", "noop"),
            ("workers", "wait"),
        ):
            done = subprocess.run(
                [sys.executable, "-m", *command, "--metrics-port", port, "--redis-url", redis_url],
                capture_output=True,
                text=True,
                timeout=60,
            )
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2, (command, done.stderr)
            assert len(lines) == 1 and lines[0].startswith("error: "), (command, done.stderr)
            assert f"--metrics-port {port}" in lines[0] and "in use" in lines[0]
        assert not (tmp_path / "archive").exists()  # refused before anything was written


def test_receipts_worker_serves_what_it_archived(
    processes: Processes, redis_client: redis.Redis, tmp_path: Path
) -> None:
    port = free_port()
    for n in range(3):
        redis_client.xadd(KEYS.lifecycle, {"kind": '"x"', "n": str(n)})
    archive = str(tmp_path / "archive")
    processes.start("lifecycle", "receipts", "--archive", archive, "--metrics-port", str(port))
    samples = scrape_until(port, lambda s: s.get(("flowstream_receipts_archived_total", ())) == 3)
    assert samples[("flowstream_receipts_archived_total", ())] == 3
    assert samples[("flowstream_receipts_batches_total", ())] >= 1
    assert samples[("flowstream_redis_round_trips_total", ())] > 0


def test_a_worker_of_several_partitions_serves_each_partitions_state_labelled(
    processes: Processes, redis_client: redis.Redis
) -> None:
    from lifecycle.partitions import Partitions

    partitions = Partitions("{flow}", 3)
    port = free_port()
    processes.start(
        "lifecycle", "worker", "--no-wait", "--partitions", "3", "--metrics-port", str(port)
    )
    third = partitions.keys(2)
    redis_client.xadd(f"{third.lifecycle}:dead", {"kind": "not json"})
    dead = f"{third.lifecycle}"
    engine = scrape_until(
        port,
        lambda s: (
            s.get(("flowstream_dead_letters", labels(partition=third.prefix, stream=dead))) == 1
        ),
    )
    assert engine[("flowstream_dead_letters", labels(partition=third.prefix, stream=dead))] == 1
    ups = {key for key in engine if key[0] == "flowstream_status_up"}
    assert ups == {("flowstream_status_up", labels(partition=k.prefix)) for k in partitions.all}
