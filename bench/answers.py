"""What a task worker's answers cost Redis, by how a batch of them is written.

``python -m bench.answers --tasks 100000 --batch 200`` starts a private Redis,
fills ``{flow}:tasks:default`` with engine-shaped start-tasks, then for each
shape reads them as a worker does (XREADGROUP), writes the batch's answers and
acknowledgement, and consumes the answers as the engine does (XREADGROUP on
``{flow}:lifecycle``, XACK) and as the receipts worker does (XREAD). Per task it
prints the server's CPU (INFO cpu) and its commands (INFO commandstats, which
counts the commands a transaction or a script runs under their own names as
well as the EXEC or EVALSHA that ran them), for each side, and this process's
CPU for the worker's side and for the engine's reading (decoding included).

Shapes:

``multi``   today: MULTI, one XADD per answer, XACK, EXEC.
``lua``     one EVALSHA per batch running the same XADDs and the XACK.
``packed``  one end-tasks entry per batch carrying every answer (an ``answers``
            field, a JSON array), in MULTI/EXEC with the XACK: the format of
            packed answers (workers.answers; see the end of this text).
``packed-lua``  the same entry and XACK in one EVALSHA.

The packed entry holds ``kind "end-tasks"``, ``worker`` and ``answers``: a list of
``[workflow, key, attempt, token, output]``, each the start-task's own JSON (a
success; a failure would take the ordinary one-answer entry). The engine side
of it is modelled by reading and decoding the entry, not by an engine.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis

from lifecycle.events import START_TASK, end_task_template
from lifecycle.keys import TASK_GROUP, Keys
from rqse.events import decode_fields, raw_stream_items
from rqse.fastpipe import Template, execute, execute_transaction
from rqse.server import RedisServer

KEYS = Keys()
TASKS = KEYS.tasks("default")
ENGINE_GROUP = "engine"
SHAPES = ("multi", "lua", "packed", "packed-lua")

# KEYS[1] answers stream, KEYS[2] task stream; ARGV: group, count of answers, then
# per answer its five JSON values, then the ids to acknowledge.
_EACH = """
local group, n = ARGV[1], tonumber(ARGV[2])
for i = 0, n - 1 do
  local a = 3 + i * 5
  redis.call('XADD', KEYS[1], '*', 'kind', '"end-task"', 'workflow', ARGV[a],
    'key', ARGV[a + 1], 'attempt', ARGV[a + 2], 'token', ARGV[a + 3],
    'status', '"SUCCESS"', 'output', ARGV[a + 4], 'worker', '"w"')
end
return redis.call('XACK', KEYS[2], group, unpack(ARGV, 3 + n * 5))
"""
# KEYS as above; ARGV: group, the answers' JSON array, then the ids to acknowledge.
_PACKED = """
redis.call('XADD', KEYS[1], '*', 'kind', '"end-tasks"', 'worker', '"w"', 'answers', ARGV[2])
return redis.call('XACK', KEYS[2], ARGV[1], unpack(ARGV, 3))
"""


def _fill(client: redis.Redis, tasks: int) -> None:
    client.delete(TASKS, KEYS.lifecycle)
    client.xgroup_create(TASKS, TASK_GROUP, id="0", mkstream=True)
    client.xgroup_create(KEYS.lifecycle, ENGINE_GROUP, id="0", mkstream=True)
    start = Template(
        "XADD", TASKS, "*",
        b"kind", orjson.dumps(START_TASK), b"workflow", None, b"name", b'"A3"', b"index", b"3",
        b"key", b'"3"', b"attempt", b"1", b"id", None, b"token", None,
        b"input", None, b"parameters", b"{}",
    )  # fmt: skip
    for first in range(0, tasks, 5000):
        execute(
            client,
            [
                start.fill(b'"w%d"' % n, b'"w%d/3/1"' % n, b'"%016x"' % (n * 7919), b'{"n":%d}' % n)
                for n in range(first, min(tasks, first + 5000))
            ],
        )


def _writer(client: redis.Redis, shape: str) -> Callable[[list[Any]], None]:
    """The write of one batch of raw start-task entries, in ``shape``."""
    xadd = end_task_template(KEYS.lifecycle, "w")
    each = client.register_script(_EACH)
    packed = client.register_script(_PACKED)

    def values(fields: dict[bytes, bytes]) -> tuple[bytes, ...]:
        return (fields[b"workflow"], b'"3"', b"1", fields[b"token"], fields[b"input"])

    def write(entries: list[Any]) -> None:
        ids = [entry_id for entry_id, _ in entries]
        if shape == "multi":
            commands: list[Any] = [xadd.fill(*values(f)) for _, f in entries]
            execute_transaction(client, [*commands, ("XACK", TASKS, TASK_GROUP, *ids)])
        elif shape == "lua":
            flat = [v for _, f in entries for v in values(f)]
            each(keys=[KEYS.lifecycle, TASKS], args=[TASK_GROUP, len(entries), *flat, *ids])
        else:
            answers = b"[" + b",".join(b"[%b,%b,%b,%b,%b]" % values(f) for _, f in entries) + b"]"
            if shape == "packed":
                fields = (b"kind", b'"end-tasks"', b"worker", b'"w"', b"answers", answers)
                execute_transaction(
                    client,
                    [("XADD", KEYS.lifecycle, "*", *fields), ("XACK", TASKS, TASK_GROUP, *ids)],
                )
            else:
                packed(keys=[KEYS.lifecycle, TASKS], args=[TASK_GROUP, answers, *ids])

    return write


def _read(client: redis.Redis, stream: str, group: str, count: int) -> list[Any]:
    reply = execute(
        client, [("XREADGROUP", "GROUP", group, "c", "COUNT", count, "STREAMS", stream, ">")]
    )[0]
    return raw_stream_items(reply)[0][1] if reply else []


def _server(client: redis.Redis) -> tuple[float, int]:
    info = client.info("cpu")
    calls = sum(v["calls"] for v in client.info("commandstats").values())
    return float(info["used_cpu_user"] + info["used_cpu_sys"]), calls


def run(client: redis.Redis, shape: str, tasks: int, batch: int) -> dict[str, float]:
    _fill(client, tasks)
    write = _writer(client, shape)
    client.config_resetstat()
    s0, c0 = _server(client)
    cpu0 = time.process_time()
    while entries := _read(client, TASKS, TASK_GROUP, batch):
        write(entries)
    worker_cpu = time.process_time() - cpu0
    s1, c1 = _server(client)
    # The engine's side: read 100 entries at a time, decode every answer, acknowledge.
    answers = 0
    cpu1 = time.process_time()
    while entries := _read(client, KEYS.lifecycle, ENGINE_GROUP, 100):
        for entry_id, fields in entries:
            if fields[b"kind"] == b'"end-tasks"':
                event = decode_fields(fields, entry_id.decode())
                answers += len(event["answers"])
            else:
                decode_fields(fields, entry_id.decode())
                answers += 1
        execute(client, [("XACK", KEYS.lifecycle, ENGINE_GROUP, *[i for i, _ in entries])])
    engine_cpu = time.process_time() - cpu1
    s2, c2 = _server(client)
    # The receipts worker's side: read the whole stream.
    last = "0"
    while reply := execute(client, [("XREAD", "COUNT", 1000, "STREAMS", KEYS.lifecycle, last)])[0]:
        last = raw_stream_items(reply)[0][1][-1][0]
    s3, c3 = _server(client)
    assert answers == tasks, (answers, tasks)
    per = 1e6 / tasks
    return {
        "worker_cpu_us": round(worker_cpu * per, 2),
        "engine_read_cpu_us": round(engine_cpu * per, 2),
        "redis_worker_us": round((s1 - s0) * per, 2),
        "redis_engine_read_us": round((s2 - s1) * per, 2),
        "redis_receipts_read_us": round((s3 - s2) * per, 2),
        "commands_worker": round((c1 - c0) / tasks, 3),
        "commands_engine_read": round((c2 - c1) / tasks, 3),
        "lifecycle_entries": client.xlen(KEYS.lifecycle),
        "memory_lifecycle_bytes_per_task": round(
            (client.memory_usage(KEYS.lifecycle) or 0) / tasks, 1
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.answers", description=__doc__)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=200, help="entries per worker read")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the smallest is kept")
    parser.add_argument("--shapes", nargs="*", choices=SHAPES, default=list(SHAPES))
    args = parser.parse_args(argv)
    best: dict[str, dict[str, float]] = {}
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        for _ in range(args.repeat):
            for shape in args.shapes:  # alternated, so that noise spreads over every shape
                figures = run(client, shape, args.tasks, args.batch)
                kept = best.setdefault(shape, figures)
                for key, value in figures.items():
                    kept[key] = min(kept[key], value)
    print(f"{args.tasks} tasks, worker batches of {args.batch}; per task:")
    for shape, figures in best.items():
        print(f"{shape:<11} " + "  ".join(f"{k} {v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
