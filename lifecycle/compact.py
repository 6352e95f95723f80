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
(:func:`read_record`, :func:`read_fields`). The lifecycle worker knows a compacted
workflow as a finished one (``engine/advance.py`` looks up ``Keys.compacted`` for an
id with no hash, or asks the workflows index, which lists it, for a start alone): a
second start of its id is a duplicate, a late answer too, a
control is refused as for any finished workflow, and a delete removes its entry in
the commit that deletes it.
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
