"""Outbox: what a listener writes when it finishes a batch, in one transaction.

Acknowledgements, events emitted by ``process()`` (``EventListener.emit``),
dead letters and deletions collected while a batch is handled go to Redis in
one MULTI/EXEC pipeline: one round trip per batch, and either all of it
happens or none does (a lost connection leaves the batch pending, to be
processed again).
"""

from __future__ import annotations

from typing import Any

import redis

from rqse.events import Fields
from rqse.fastpipe import execute_transaction

__all__ = ["Outbox"]


class Outbox:
    """Writes pending for the batch in hand."""

    __slots__ = ("acks", "adds", "deletes")

    def __init__(self) -> None:
        self.acks: dict[str, list[bytes]] = {}
        # (stream, fields, XADD options), or an XADD already packed (a filled Template)
        self.adds: list[tuple[str, Fields, dict[str, Any]] | bytes] = []
        self.deletes: list[tuple[str, tuple[str | bytes, ...]]] = []

    def acks_for(self, stream: str) -> list[bytes]:
        """The list to append acknowledged ids of ``stream`` to (hot path: no call per id)."""
        acks = self.acks.get(stream)
        if acks is None:
            acks = self.acks[stream] = []
        return acks

    def add(self, stream: str, fields: Fields, options: dict[str, Any]) -> None:
        self.adds.append((stream, fields, options))

    def add_packed(self, xadd: bytes) -> None:
        self.adds.append(xadd)

    def delete(self, stream: str, *ids: str | bytes) -> None:
        self.deletes.append((stream, ids))

    def __bool__(self) -> bool:
        return bool(self.adds or self.deletes or any(self.acks.values()))

    def clear(self) -> None:
        self.acks.clear()
        self.adds.clear()
        self.deletes.clear()

    def commands(self, group: str) -> list[Any]:
        """What :meth:`flush` sends inside MULTI/EXEC, in order (nothing is cleared).

        Appends go first, so an event emitted while processing an entry is in
        its stream before that entry's acknowledgement is visible.
        """
        commands: list[Any] = []
        for add in self.adds:
            if isinstance(add, bytes):
                commands.append(add)
                continue
            stream, fields, options = add
            command: list[Any] = ["XADD", stream, *_trim_arguments(options), "*"]
            for name, value in fields.items():
                command += (name, value)
            commands.append(command)
        for stream, ids in self.deletes:
            commands.append(["XDEL", stream, *ids])
        for stream, acks in self.acks.items():
            if acks:
                commands.append(["XACK", stream, group, *acks])
        return commands

    def flush(self, client: redis.Redis, group: str) -> None:
        """Write everything in one transaction, then forget it (also on failure)."""
        try:
            commands = self.commands(group)
            if commands:
                execute_transaction(client, commands)
        finally:
            self.clear()


def _trim_arguments(options: dict[str, Any]) -> list[Any]:
    """XADD's MAXLEN/MINID arguments from redis-py style keyword options."""
    if not options:
        return []
    approximate = ["~"] if options.get("approximate", True) else []
    if options.get("maxlen") is not None:
        return ["MAXLEN", *approximate, options["maxlen"]]
    if options.get("minid") is not None:
        return ["MINID", *approximate, options["minid"]]
    return []
