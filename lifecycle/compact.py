"""A finished workflow once compacted: one entry of a shared hash in place of its own
hash, read back as the fields that hash had.

Retention's first step (``engine/scripts/expire.lua``) turns what is left of a
finished workflow's hash, its task records gone, into one value of
``Keys.compacted`` (field: its id), numbers in base 36:

    ``1`` <graph's short name>,<created>,<ended - created>,<compacted - ended>,
    <removal due - ended, empty: never>[,<priority>] ``\\n`` <name> ``\\n``
    <input JSON> ``\\n`` <state JSON less its leading ``{"status":"finished"``>

(``2`` in place of ``1``: the state was ``{"status":"finished","output":X}``; X
follows.) A graph's short name stands for its hash in ``Keys.graph_refs``.

It holds what readers show (state, output, times, name, input, graph) and nothing
the engine needs (version, attempt salt: a finished workflow takes no answer and
cannot be restarted). Readers get it back as the fields its hash had, so
``inspect``, ``list``, ``status`` and replay's comparison read both forms alike
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
    "graph_ref",
    "read_compacted",
    "read_fields",
    "read_record",
    "removal_due",
    "restore_for_delete",
]

FORMAT = b"1"
OUTPUT_ONLY = b"2"  # the same, its state only status and output: the output follows bare
# The fields the record keeps, in the order expire.lua takes them.
KEPT = (rec.CREATED, rec.ENDED, rec.GRAPH, rec.NAME, rec.INPUT, rec.STATE, rec.PRIORITY)
# The fields it drops: nothing reads them once the workflow finished.
DROPPED = (rec.VERSION, rec.SALT)
_FINISHED = b'{"status":"finished"'
_OUTPUT = b',"output":'


def graph_ref(value: bytes) -> bytes:
    """The short name of a compacted record's graph (b"" when it is no record)."""
    return value[1 : value.find(b",")] if value[:1] in (FORMAT, OUTPUT_ONLY) else b""


def removal_due(value: bytes) -> int | None:
    """When retention removes a compacted record (ms); None: never, or no record."""
    try:
        parts = value[1:].split(b"\n", 1)[0].split(b",")
        if value[:1] not in (FORMAT, OUTPUT_ONLY) or not parts[4]:
            return None
        return int(parts[1], 36) + int(parts[2], 36) + int(parts[4], 36)
    except (ValueError, IndexError):
        return None


def fields(value: bytes, digest: bytes | None) -> dict[bytes, bytes]:
    """The hash fields a compacted record stands for (those :data:`KEPT`, and
    :data:`records.COMPACTED`), ``digest`` the graph hash its short name stands for. A
    value that is not one comes back as the state field, so that readers report it as
    they report a corrupt state."""
    form = value[:1]
    try:
        if form not in (FORMAT, OUTPUT_ONLY):
            raise ValueError
        head, name, input_, state = value[1:].split(b"\n", 3)
        parts = head.split(b",")
        if len(parts) not in (5, 6):
            raise ValueError
        created = int(parts[1], 36)
        ended = created + int(parts[2], 36)
        compacted = ended + int(parts[3], 36)
        priority = int(parts[5]) if len(parts) == 6 else None
    except ValueError:
        return {rec.STATE.encode(): value}
    if form == OUTPUT_ONLY:
        state = _OUTPUT + state + b"}"
    found = {
        rec.CREATED.encode(): b"%d" % created,
        rec.ENDED.encode(): b"%d" % ended,
        rec.COMPACTED.encode(): b"%d" % compacted,
        rec.INPUT.encode(): input_,
        rec.STATE.encode(): _FINISHED + state,
    }
    if digest:
        found[rec.GRAPH.encode()] = digest
    if name:
        found[rec.NAME.encode()] = name
    if priority is not None:
        found[rec.PRIORITY.encode()] = b"%d" % priority
    return found


def read_compacted(
    client: redis.Redis, keys: Keys, workflow_ids: Sequence[str]
) -> list[dict[bytes, bytes] | None]:
    """Per workflow, the fields of its compacted record (None: not compacted), in two
    round trips: the records, then their graphs' names."""
    if len(workflow_ids) == 1:  # HGET: the documented ACL of `run` grants no HMGET
        return _expand(client, keys, [client.hget(keys.compacted, workflow_ids[0])])  # type: ignore[list-item]
    values: list[Any] = client.hmget(keys.compacted, list(workflow_ids)) if workflow_ids else []
    return _expand(client, keys, values)


def _expand(
    client: redis.Redis, keys: Keys, values: list[bytes | None]
) -> list[dict[bytes, bytes] | None]:
    refs = sorted({graph_ref(value) for value in values if value is not None} - {b""})
    pipe = client.pipeline(transaction=False)
    for ref in refs:
        pipe.hget(keys.graph_refs, b"#" + ref)
    named: list[Any] = pipe.execute() if refs else []
    digests = dict(zip(refs, named, strict=True))
    return [
        None if value is None else fields(value, digests.get(graph_ref(value))) for value in values
    ]


def read_record(client: redis.Redis, keys: Keys, workflow_id: str) -> dict[bytes, bytes]:
    """The workflow's fields: its hash, else its compacted record's; {} when neither is
    there."""
    raw: dict[bytes, bytes] = client.hgetall(keys.workflow(workflow_id))  # type: ignore[assignment]
    if raw:
        return raw
    return read_compacted(client, keys, [workflow_id])[0] or {}


def read_fields(
    client: redis.Redis, keys: Keys, workflow_ids: Sequence[str], names: Sequence[str]
) -> list[list[bytes | None]]:
    """Per workflow, the values of ``names`` (None when missing), from its hash or its
    compacted record: one round trip, and two more for the ids whose hash is gone."""
    pipe = client.pipeline(transaction=False)
    for workflow_id in workflow_ids:
        pipe.hmget(keys.workflow(workflow_id), *names)
    rows: list[list[bytes | None]] = pipe.execute()
    gone = [n for n, row in enumerate(rows) if all(value is None for value in row)]
    if gone:
        encoded = [name.encode() for name in names]
        compacted = read_compacted(client, keys, [workflow_ids[n] for n in gone])
        for n, found in zip(gone, compacted, strict=True):
            if found is not None:
                rows[n] = [found.get(name) for name in encoded]
    return rows


# Turns a compacted record back into a hash (version 1: the lifecycle reads it as an
# existing workflow) unless a hash is there, from the fields read before: unless the
# record changed meanwhile. Returns whether it did.
_RESTORE = """
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] or redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""


def restore_for_delete(client: redis.Redis, keys: Keys, workflow_ids: Sequence[str]) -> int:
    """Write each compacted workflow of ``workflow_ids`` back as a hash, for the lifecycle
    to delete it as it deletes any (its delete-workflow event archived, the index and
    schedules cleared in its commit); returns how many were. Its entry in the compacted
    removals stays: retention drops it, finding no record due then."""
    if not workflow_ids:
        return 0
    values: list[Any] = client.hmget(keys.compacted, list(workflow_ids))
    found = [(i, v) for i, v in zip(workflow_ids, values, strict=True) if v is not None]
    if not found:
        return 0
    records = _expand(client, keys, [value for _, value in found])
    script = client.register_script(_RESTORE)
    pipe = client.pipeline(transaction=False)
    for (workflow_id, value), record in zip(found, records, strict=True):
        flat: list[Any] = [workflow_id, value, rec.VERSION.encode(), b"1"]
        for name, field in (record or {}).items():
            flat += (name, field)
        script(keys=[keys.workflow(workflow_id), keys.compacted], args=flat, client=pipe)
    return sum(1 for done in pipe.execute() if done)
