"""Real processes: wait workers killed with SIGKILL lose nothing; `workers run` stops cleanly."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from rqse.events import encode_event
from tests.conftest import wait_until
from tests.processes import Processes
from tests.workers.helpers import KEYS, Threads, entry_ms, events, submit, wait_for_end


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()  # SIGKILL: no cleanup at all
    proc.wait()


def test_a_three_second_delay_ends_on_time_although_its_worker_is_killed_after_one(
    redis_client: redis.Redis, threads: Threads, processes: Processes
) -> None:
    threads.lifecycle()
    first = processes.start("workers", "wait", "--consumer", "wait-a")
    workflow = submit(redis_client, "wait:delay (- duration: 3 -)", {"n": 1})
    wait_until(lambda: redis_client.zcard(KEYS.wait_delays), timeout=15, what="registration")
    (start_id, _), *_ = events(redis_client, KEYS.tasks("wait"))
    started = entry_ms(start_id) / 1000
    time.sleep(max(0.0, started + 1.0 - time.time()))
    kill(first)
    processes.start("workers", "wait", "--consumer", "wait-b")
    assert wait_for_end(redis_client, workflow, timeout=15)["status"] == "finished"
    (end_id, end), *_ = events(redis_client, KEYS.lifecycle, "end-task")
    assert 3000 <= entry_ms(end_id) - entry_ms(start_id) < 3600
    assert end["output"] == {"n": 1}


def test_a_wait_event_outlives_its_worker_and_an_event_sent_while_none_runs(
    redis_client: redis.Redis, threads: Threads, processes: Processes
) -> None:
    threads.lifecycle()
    first = processes.start("workers", "wait", "--consumer", "wait-a")
    workflow = submit(redis_client, "wait:event (- {event: ready} -)", {"job": 4})
    wait_until(lambda: redis_client.hlen(KEYS.wait_events("ready")), timeout=15, what="wait")
    kill(first)
    redis_client.xadd(
        KEYS.lifecycle,
        encode_event({"kind": "ready", "workflow": workflow, "output": {"go": True}}),
    )
    processes.start("workers", "wait", "--consumer", "wait-b")
    final = wait_for_end(redis_client, workflow, timeout=15)
    assert final == {"status": "finished", "output": {"go": True}}


def test_workers_run_serves_a_task_listener_with_threads_and_stops_on_sigterm(
    redis_client: redis.Redis, threads: Threads, processes: Processes
) -> None:
    threads.lifecycle()
    proc = processes.start(
        "workers", "run", "tests.workers.sample:Upper", "--concurrency", "3", "--consumer", "up"
    )
    ids = [submit(redis_client, "text:shout", {"t": f"w{n}"}) for n in range(20)]
    assert all(wait_for_end(redis_client, w, timeout=15)["status"] == "finished" for w in ids)
    consumers = {e["worker"] for _, e in events(redis_client, KEYS.lifecycle, "end-task")}
    assert consumers <= {"up-0", "up-1", "up-2"}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def test_workers_run_refuses_a_class_that_is_no_listener_in_one_line(
    processes: Processes,
) -> None:
    proc = processes.start("workers", "run", "collections:OrderedDict", stderr=True)
    assert proc.wait(timeout=15) == 2
    assert proc.stderr is not None
    message = proc.stderr.read().decode().strip()
    assert message.startswith("error: 'collections:OrderedDict' is <class")
    assert "expected a subclass of rqse.EventListener" in message
    assert len(message.splitlines()) == 1


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        ("class Broken(:\n    pass\n", "broken_mod:Broken", "broken_mod.py:1:14: SyntaxError: "),
        ("import no_such_dependency_here\n", "broken_mod:X", "cannot import 'broken_mod'"),
        ("raise RuntimeError('no config')\n", "broken_mod:X", "raised RuntimeError: no config"),
        ("X = 1\n", "broken_mod:Missing", "module 'broken_mod' has no 'Missing'"),
    ],
)
def test_workers_run_names_a_module_that_cannot_load_in_one_line_and_exits_2(
    processes: Processes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    source: str,
    target: str,
    expected: str,
) -> None:
    (tmp_path / "broken_mod.py").write_text(source)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    proc = processes.start("workers", "run", target, stderr=True)
    assert proc.wait(timeout=15) == 2
    assert proc.stderr is not None
    message = proc.stderr.read().decode().strip()
    assert expected in message, message
    assert len(message.splitlines()) == 1 and "Traceback" not in message
