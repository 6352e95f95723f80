"""Many commands in one round trip, packed in C.

redis-py's pipeline converts and type-checks every argument in Python, about a
microsecond each; the engine's hot paths send tens of arguments per event, so
that conversion was the largest single cost of a worker. Here arguments must
already be ``bytes``, ``str``, ``int`` or ``float``; hiredis packs each
command, one ``sendall`` writes them all, and the replies are read in order
with the connection's own parser. Error replies are returned in place as
:class:`redis.ResponseError` instances, so one failed command (a ``NOSCRIPT``)
can be retried alone.

A command may also arrive already packed (``bytes``): a :class:`Template` packs
the arguments that never change once, and fills in the rest per use.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import hiredis
import redis

try:  # what redis-py's hiredis reader returns for "no whole reply buffered yet"
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
except ImportError:  # another redis-py layout: read_response() is used instead
    _NOT_ENOUGH_DATA = None
_PUSH = getattr(hiredis, "PushNotification", None)  # hiredis >= 3.2

__all__ = [
    "SLOT",
    "Send",
    "Template",
    "execute",
    "execute_transaction",
    "internals_missing",
    "pack",
    "read",
    "send",
    "session",
    "transaction",
    "transaction_replies",
]

Argument = bytes | str | int | float
# A command's arguments, or the whole command already packed (Template.fill).
Command = Sequence[Argument] | bytes
Send = Callable[[Sequence[Command]], list[Any]]  # one round trip of a session


SLOT = None  # in a Template: an argument given at each fill()


class Template:
    """A command whose arguments are fixed but for a few ``SLOT``s, packed once.

    ``fill(*values)`` costs one bytes format, about half of packing every
    argument anew (the engine's events repeat most of their fields: names,
    kinds, the stream). Slot values are ``bytes``, exactly one per slot (else
    TypeError).
    """

    __slots__ = ("arguments", "fill", "_slots")

    def __init__(self, *arguments: Argument | None) -> None:
        self.arguments = arguments
        parts = [b"*%d\r\n" % len(arguments)]
        for argument in arguments:
            if argument is SLOT:
                parts.append(b"$%d\r\n%b\r\n")
            else:  # the packed constant, its % escaped for the format
                parts.append(hiredis.pack_command((argument,))[4:].replace(b"%", b"%%"))
        self._slots = arguments.count(SLOT)
        #: ``fill(*values)``: the packed command with ``values`` in its slots, in order.
        self.fill: Callable[..., bytes] = _filler(b"".join(parts), self._slots)

    def unpacked(self, *values: bytes) -> list[Argument]:
        """The arguments ``fill(*values)`` packs, as a list."""
        slots = iter(values)
        return [next(slots) if a is SLOT else a for a in self.arguments]


def pack(arguments: Sequence[Argument]) -> bytes:
    """One command packed, as a Template's fill gives it."""
    return hiredis.pack_command(tuple(arguments))  # type: ignore[arg-type,no-any-return]


def _filler(format_: bytes, slots: int) -> Callable[..., bytes]:
    """``fill`` of a Template: a function of exactly ``slots`` arguments that formats
    them with their lengths, written out for that count (a loop building the
    arguments' tuple took as long as the format itself, on every event). The code is
    made once per count: a flow with thousands of nodes has thousands of templates."""
    maker = _FILLER_MAKERS.get(slots)
    if maker is None:
        names = [f"v{n}" for n in range(slots)]
        sized = "".join(f"len({name}), {name}, " for name in names)
        scope: dict[str, Any] = {}
        exec(
            "def make(format_):\n"
            f"    def fill({', '.join(names)}):\n"
            f"        return format_ % ({sized})\n"
            "    return fill\n",
            scope,
        )
        maker = _FILLER_MAKERS[slots] = scope["make"]
    return maker(format_)  # type: ignore[no-any-return]


_FILLER_MAKERS: dict[int, Callable[[bytes], Callable[..., bytes]]] = {}


def internals_missing(client: redis.Redis) -> list[str]:
    """The redis-py internals this module (and the listener's raw read) relies on that
    the installed redis-py lacks, checked on one of ``client``'s connections (an empty
    list: all there). Without them the fast path is off, silently but for this list."""
    missing = []
    if _NOT_ENOUGH_DATA is None:
        missing.append("redis._parsers.hiredis.NOT_ENOUGH_DATA")
    pool = client.connection_pool
    try:
        connection = pool.get_connection()
    except TypeError as error:  # redis-py < 6 wants a command name
        return [*missing, f"ConnectionPool.get_connection() without arguments ({error})"]
    try:
        connection.connect()  # type: ignore[no-untyped-call]
        for name in ("send_packed_command", "send_command", "read_response", "disconnect"):
            if not callable(getattr(connection, name, None)):
                missing.append(f"Connection.{name}()")
        if not isinstance(getattr(connection, "_sock", None), socket.socket):
            missing.append("Connection._sock (the connected socket)")
        parser = getattr(connection, "_parser", None)
        if not isinstance(getattr(parser, "_reader", None), hiredis.Reader):
            missing.append("Connection._parser._reader (a hiredis.Reader)")
        if getattr(connection, "protocol", 2) not in (2, "2", None):
            if _PUSH is None:
                missing.append("hiredis.PushNotification (hiredis >= 3.2, for RESP3)")
            if not callable(getattr(parser, "handle_push_response", None)):
                missing.append("Connection._parser.handle_push_response()")
    finally:
        pool.release(connection)
    return missing


def execute(client: redis.Redis, commands: Sequence[Command]) -> list[Any]:
    """Send ``commands`` in one round trip; return their replies (errors as values)."""
    if not commands:
        return []
    with session(client) as send:
        return send(commands)


@contextmanager
def session(client: redis.Redis) -> Iterator[Send]:
    """Several round trips on one connection, for what needs it (WATCH, then MULTI/EXEC):
    ``with session(client) as send: send(commands)``. The caller leaves the connection
    as it found it (no WATCH or MULTI left open).

    Once the first round trip went out, the session never reconnects: a WATCH lives
    in its connection, and redis-py would otherwise replace a dropped connection
    silently (a health check, a retry) and let the transaction run unwatched. A
    lost connection raises ``redis.ConnectionError`` instead.
    """
    pool = client.connection_pool
    connection = pool.get_connection()
    bound: list[Any] = []  # the socket of the first round trip

    def send(commands: Sequence[Command]) -> list[Any]:
        if bound and getattr(connection, "_sock", None) is not bound[0]:
            raise redis.ConnectionError("connection lost in the middle of a session")
        replies = _round_trip(connection, commands, check_health=not bound)
        if not bound:
            bound.append(getattr(connection, "_sock", None))
        return replies

    try:
        yield send
    except BaseException:
        # The stream of replies may be out of step with the commands: never reuse it.
        connection.disconnect()  # type: ignore[no-untyped-call]
        raise
    finally:
        pool.release(connection)


def send(connection: Any, commands: Sequence[Command]) -> None:
    """Write ``commands`` on ``connection`` (a redis-py connection the caller holds) in
    one ``sendall``; :func:`read` takes their replies, in as many steps as the caller
    likes (a blocking command's reply after those before it, say)."""
    _send(connection, commands, check_health=False)


def read(connection: Any, count: int) -> list[Any]:
    """The next ``count`` replies on ``connection``, error replies as values. A lost
    connection raises ``redis.ConnectionError``; the caller then drops the connection."""
    return _read(connection, count)


def transaction_replies(replies: Sequence[Any]) -> list[Any]:
    """The replies of the commands a ``MULTI, ..., EXEC`` sent as is ran, from the
    replies to all of it; raises the first error (a refused or a failed command)."""
    executed = replies[-1]
    if isinstance(executed, BaseException):  # EXECABORT: say which command was refused
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        raise executed
    if executed is None:
        raise redis.WatchError("transaction aborted")
    for reply in executed:
        if isinstance(reply, BaseException):
            raise reply
    return list(executed)


def _round_trip(connection: Any, commands: Sequence[Command], check_health: bool) -> list[Any]:
    if not commands:
        return []
    _send(connection, commands, check_health)
    return _read(connection, len(commands))


def _send(connection: Any, commands: Sequence[Command], check_health: bool) -> None:
    pack: Callable[[tuple[Argument, ...]], bytes] = hiredis.pack_command  # type: ignore[assignment]
    connection.send_packed_command(
        [b"".join([c if type(c) is bytes else pack(tuple(c)) for c in commands])],
        check_health=check_health,
    )


def _read(connection: Any, count: int) -> list[Any]:
    parser = getattr(connection, "_parser", None)
    reader = getattr(parser, "_reader", None)
    sock = getattr(connection, "_sock", None)
    # RESP3 may interleave push frames (invalidations, maintenance notices) with
    # replies: hiredis marks them (PushNotification, hiredis >= 3.2) and they go to
    # the parser's own handler; without that mark, redis-py's reading sets them aside.
    resp2 = getattr(connection, "protocol", 2) in (2, "2", None)
    if (
        (resp2 or _PUSH is not None)
        and _NOT_ENOUGH_DATA is not None
        and isinstance(reader, hiredis.Reader)
        and sock
    ):
        replies = _read_replies(reader, sock, count, None if resp2 else parser)
    else:
        replies = []
        for _ in range(count):
            try:
                replies.append(connection.read_response())
            except redis.ResponseError as error:
                replies.append(error)
    # A cluster slot's connection (rqse.cluster) learns from a MOVED reply here, as
    # it would from read_response, that its slot has a new master.
    check = getattr(connection, "check_replies", None)
    if check is not None:
        check(replies)
    return replies


def _read_replies(
    reader: hiredis.Reader, sock: socket.socket, count: int, resp3_parser: Any
) -> list[Any]:
    """``count`` replies straight from the connection's own hiredis reader (so nothing it
    buffered is skipped): a third of ``read_response``'s cost per reply, which matters
    when a transaction answers QUEUED to every command. Error replies come back as the
    exception instances redis-py's parser makes of them (NoScriptError, ...). On a
    RESP3 connection (``resp3_parser`` given), push frames go to its handler."""
    replies: list[Any] = []
    gets, feed = reader.gets, reader.feed
    # RESP2 has no booleans: a reader made without notEnoughData says False for "no
    # whole reply yet". In RESP3 False is a reply; redis-py always sets notEnoughData.
    resp2 = resp3_parser is None
    try:
        while len(replies) < count:
            reply = gets()
            if reply is _NOT_ENOUGH_DATA or (reply is False and resp2):
                data = sock.recv(65536)
                if not data:
                    raise redis.ConnectionError("Connection closed by server.")
                feed(data)
            elif not resp2 and type(reply) is _PUSH:
                handle = getattr(resp3_parser, "handle_push_response", None)
                if handle is not None:
                    handle(reply)
            else:
                replies.append(reply)
    except TimeoutError as error:
        raise redis.TimeoutError(f"Timeout reading from socket: {error}") from error
    except OSError as error:
        raise redis.ConnectionError(f"Error while reading from socket: {error}") from error
    return replies


def execute_transaction(client: redis.Redis, commands: Sequence[Command]) -> list[Any]:
    """``commands`` inside MULTI/EXEC: all or none. Raises on an error reply."""
    if len(commands) == 1:
        (reply,) = execute(client, commands)
        if isinstance(reply, BaseException):
            raise reply
        return [reply]
    with session(client) as send:
        replies = transaction(send, commands)
    if replies is None:
        raise redis.WatchError("transaction aborted")
    return replies


def transaction(
    send: Send, commands: Sequence[Command], *, raise_errors: bool = True
) -> list[Any] | None:
    """``commands`` inside MULTI/EXEC in one round trip of a :func:`session`: their
    replies, or None when a key the session WATCHes changed (nothing was written).
    Raises when a command was refused while queued (nothing was written), and on an
    error reply of a command that ran — unless ``raise_errors`` is False: then such a
    reply is returned in its place (the other commands ran: EXEC does not roll back)."""
    replies = send([("MULTI",), *commands, ("EXEC",)])
    executed = replies[-1]
    if isinstance(executed, BaseException):  # EXECABORT: say which command was refused
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
    if executed is None:
        return None
    if raise_errors:
        for reply in executed:  # QUEUED replies carry no error once EXEC ran
            if isinstance(reply, BaseException):
                raise reply
    return list(executed)
