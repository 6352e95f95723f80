"""Many commands in one round trip, packed in C.

redis-py's pipeline converts and type-checks every argument in Python, about a
microsecond each; the engine's hot paths send tens of arguments per event, so
that conversion was the largest single cost of a worker. Here arguments must
already be ``bytes``, ``str``, ``int`` or ``float``; hiredis packs each
command, one ``sendall`` writes them all, and the replies are read in order
with the connection's own parser. Error replies are returned in place as
:class:`redis.ResponseError` instances, so one failed command (a ``NOSCRIPT``)
can be retried alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import hiredis
import redis

__all__ = ["execute", "execute_transaction"]

Command = Sequence[bytes | str | int | float]


def execute(client: redis.Redis, commands: Sequence[Command]) -> list[Any]:
    """Send ``commands`` in one round trip; return their replies (errors as values)."""
    if not commands:
        return []
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        connection.send_packed_command(
            [b"".join([hiredis.pack_command(tuple(c)) for c in commands])]
        )
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(connection.read_response())
            except redis.ResponseError as error:
                replies.append(error)
        return replies
    except BaseException:
        # The stream of replies is now out of step with the commands: never reuse it.
        connection.disconnect()
        raise
    finally:
        pool.release(connection)


def execute_transaction(client: redis.Redis, commands: Sequence[Command]) -> list[Any]:
    """``commands`` inside MULTI/EXEC: all or none. Raises on an error reply."""
    if len(commands) == 1:
        replies = execute(client, commands)
    else:
        replies = execute(client, [("MULTI",), *commands, ("EXEC",)])
        for reply in replies[: len(commands) + 1]:
            if isinstance(reply, BaseException):  # a command refused while queueing
                raise reply
        replies = replies[-1]
        if replies is None:
            raise redis.WatchError("transaction aborted")
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    return list(replies)
