"""A finished workflow once compacted: one string in place of its hash, read as its fields.

Retention's first step (``engine/scripts/expire.lua``) turns what is left of a
finished workflow's hash, its task records gone, into one string at
``Keys.compacted(id)``:

    ``1`` <graph hash: 32 raw bytes> <created>,<ended - created>,<compacted - ended>,
    <removal due - ended, -1: never>[,<priority>] ``\\n`` <name> ``\\n`` <input JSON>
    ``\\n`` <state JSON without its leading ``{"status":"finished"``>

(``2`` in place of ``1``: the state was ``{"status":"finished","output":X}``; X follows.)

It holds what readers show (state, output, times, name, input, graph) and nothing
the engine needs (version, attempt salt: a finished workflow takes no answer and
cannot be restarted). Readers get it back as the fields its hash had (:func:`fields`),
so ``inspect``, ``list``, ``status`` and replay's comparison read both forms alike
(:func:`read_record`, :func:`read_fields`). A compacted workflow that is deleted is
first written back as a hash (:func:`restore_for_delete`): the lifecycle deletes it
as any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from lifecycle import records as rec
from lifecycle.keys import Keys

__all__ = [
    "DROPPED",
    "KEPT",
    "fields",
    "read_fields",
    "read_record",
    "restore_for_delete",
]

FORMAT = b"1"
OUTPUT_ONLY = b"2"  # the same, its state only status and output: the output follows bare
# The fields the string keeps, in the order expire.lua takes them.
KEPT = (rec.CREATED, rec.ENDED, rec.GRAPH, rec.NAME, rec.INPUT, rec.STATE, rec.PRIORITY)
# The fields it drops: nothing reads them once the workflow finished.
DROPPED = (rec.VERSION, rec.SALT)
_FINISHED = b'{"status":"finished"'
_OUTPUT = b',"output":'
_DIGEST = 32


def fields(value: bytes) -> dict[bytes, bytes]:
    """The hash fields a compacted record stands for (those :data:`KEPT`, and
    :data:`records.COMPACTED`). A value that is not one comes back as the state field,
    so that readers report it as they report a corrupt state."""
    try:
        form = value[:1]
        if form not in (FORMAT, OUTPUT_ONLY):
            raise ValueError
        digest = value[1 : 1 + _DIGEST]
        head, name, input_, state = value[1 + _DIGEST :].split(b"\n", 3)
        numbers = [int(part) for part in head.split(b",")]
        created = numbers[0]
        ended = created + numbers[1]
        compacted = ended + numbers[2]
        found = {
            rec.CREATED.encode(): b"%d" % created,
            rec.ENDED.encode(): b"%d" % ended,
            rec.COMPACTED.encode(): b"%d" % compacted,
            rec.GRAPH.encode(): digest.hex().encode(),
            rec.INPUT.encode(): input_,
            rec.STATE.encode(): _FINISHED
            + (_OUTPUT + state + b"}" if form == OUTPUT_ONLY else state),
        }
        if len(digest) != _DIGEST or len(numbers) not in (4, 5):
            raise ValueError
    except ValueError:
        return {rec.STATE.encode(): value}
    if name:
        found[rec.NAME.encode()] = name
    if len(numbers) == 5:
        found[rec.PRIORITY.encode()] = b"%d" % numbers[4]
    return found


def read_record(client: redis.Redis, keys: Keys, workflow_id: str) -> dict[bytes, bytes]:
    """The workflow's fields: its hash, else its compacted record's; {} when neither is
    there."""
    raw: dict[bytes, bytes] = client.hgetall(keys.workflow(workflow_id))  # type: ignore[assignment]
    if raw:
        return raw
    packed: Any = client.get(keys.compacted(workflow_id))
    return fields(packed) if packed is not None else {}


def read_fields(
    client: redis.Redis, keys: Keys, workflow_ids: Sequence[str], names: Sequence[str]
) -> list[list[bytes | None]]:
    """Per workflow, the values of ``names`` (None when missing), from its hash or its
    compacted record: one round trip, and a second for the ids whose hash is gone."""
    pipe = client.pipeline(transaction=False)
    for workflow_id in workflow_ids:
        pipe.hmget(keys.workflow(workflow_id), *names)
    rows: list[list[bytes | None]] = pipe.execute()
    gone = [n for n, row in enumerate(rows) if all(value is None for value in row)]
    if gone:
        pipe = client.pipeline(transaction=False)
        for n in gone:
            pipe.get(keys.compacted(workflow_ids[n]))
        encoded = [name.encode() for name in names]
        for n, packed in zip(gone, pipe.execute(), strict=True):
            if packed is not None:
                found = fields(packed)
                rows[n] = [found.get(name) for name in encoded]
    return rows


# Turns a compacted record back into a hash (version 1: the lifecycle reads it as an
# existing workflow) unless a hash is there, from the fields read before: unless the
# record changed meanwhile. Returns whether it did.
_RESTORE = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] or redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('DEL', KEYS[2])
return 1
"""


def restore_for_delete(client: redis.Redis, keys: Keys, workflow_ids: Sequence[str]) -> int:
    """Write each compacted workflow of ``workflow_ids`` back as a hash, for the lifecycle
    to delete it as it deletes any (its delete-workflow event archived, the index and
    schedules cleared in its commit); returns how many were. Its entry in the compacted
    removals stays: retention drops it, finding no record due then."""
    pipe = client.pipeline(transaction=False)
    for workflow_id in workflow_ids:
        pipe.get(keys.compacted(workflow_id))
    found = [(i, packed) for i, packed in zip(workflow_ids, pipe.execute(), strict=True) if packed]
    if not found:
        return 0
    script = client.register_script(_RESTORE)
    pipe = client.pipeline(transaction=False)
    for workflow_id, packed in found:
        flat: list[bytes] = [packed, rec.VERSION.encode(), b"1"]
        for name, value in fields(packed).items():
            flat += (name, value)
        script(
            keys=[keys.workflow(workflow_id), keys.compacted(workflow_id)], args=flat, client=pipe
        )
    return sum(1 for done in pipe.execute() if done)
