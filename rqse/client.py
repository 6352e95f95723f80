"""EventClient: append events to a stream and read them back."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import redis

from rqse.connection import RedisSettings, mask_url, translate_errors
from rqse.errors import ConfigurationError
from rqse.events import decode_fields, encode_event, stream_items

__all__ = ["EventClient", "StreamEntry", "scan_entries"]

logger = logging.getLogger(__name__)

StreamEntry = tuple[str, dict[str, Any]]


def _xadd_options(maxlen: int | None, minid: str | None, approximate: bool) -> dict[str, Any]:
    """Keyword arguments of redis-py ``xadd`` for an explicit trimming policy."""
    if maxlen is None and minid is None:
        return {}
    return {"maxlen": maxlen, "minid": minid, "approximate": approximate}


class EventClient:
    """Events on one Redis stream ``key``.

    Connection: ``pool`` if given, else a new pool for the location resolved by
    :meth:`rqse.connection.RedisSettings.resolve` from ``url``, ``host``,
    ``port``, ``username``, ``password`` and the environment (read now, once).
    Redis errors surface as :class:`rqse.errors.RedisUnavailable` or
    :class:`rqse.errors.RedisCommandError`.
    """

    def __init__(
        self,
        key: str,
        url: str | None = None,
        host: str | None = None,
        port: int | str | None = None,
        username: str | None = None,
        password: str | None = None,
        pool: redis.ConnectionPool | None = None,
    ) -> None:
        if not key or not isinstance(key, str):
            raise ValueError(f"key must be a non-empty string, got {key!r}")
        self._stream_key = key
        if pool is None:
            settings = RedisSettings.resolve(url, host, port, username, password)
            pool = settings.pool()
            self._where = settings.masked_url
            self._own_pool = True
        else:
            self._where = mask_url(_pool_location(pool))
            self._own_pool = False
        if pool.connection_kwargs.get("decode_responses"):
            raise ConfigurationError(
                f"the connection pool for {self._where} decodes responses; rqse needs "
                "bytes (create the pool with decode_responses=False)"
            )
        self._pool = pool
        self._redis = redis.Redis(connection_pool=pool)

    # -- properties kept from rqse 0.5 ------------------------------------------------
    @property
    def key(self) -> str:
        """The stream this client appends to and reads from."""
        return self._stream_key

    @property
    def pool(self) -> redis.ConnectionPool:
        return self._pool

    @property
    def connection(self) -> redis.Redis:
        """A redis-py client on this client's pool (thread-safe, shared)."""
        return self._redis

    @property
    def location(self) -> str:
        """Where Redis is, password masked (for logs)."""
        return self._where

    # -- writing -------------------------------------------------------------------
    def append(
        self,
        event: Mapping[str, Any],
        key: str | None = None,
        *,
        maxlen: int | None = None,
        minid: str | None = None,
        approximate: bool = True,
    ) -> str:
        """Append ``event`` to ``key`` (default: this client's stream); return its id.

        ``maxlen``/``minid`` trim the stream in the same command (XADD MAXLEN/MINID,
        ``~`` unless ``approximate`` is False): an explicit policy that removes
        entries whether or not anyone has read them.
        """
        stream = key or self._stream_key
        fields = encode_event(event)
        with translate_errors("XADD", f"{stream!r} at {self._where}"):
            entry_id = self._redis.xadd(stream, fields, **_xadd_options(maxlen, minid, approximate))
        return _text(entry_id)

    def append_many(
        self,
        events: Iterable[Mapping[str, Any]],
        key: str | None = None,
        *,
        maxlen: int | None = None,
        minid: str | None = None,
        approximate: bool = True,
    ) -> list[str]:
        """Append several events in one pipeline (one round trip); return their ids."""
        stream = key or self._stream_key
        options = _xadd_options(maxlen, minid, approximate)
        pipe = self._redis.pipeline(transaction=False)
        for event in events:
            pipe.xadd(stream, encode_event(event), **options)
        with translate_errors("XADD (pipeline)", f"{stream!r} at {self._where}"):
            ids = pipe.execute()
        return [_text(entry_id) for entry_id in ids]

    def delete(self, *ids: str) -> int:
        """Delete entries by id (XDEL); return how many existed."""
        if not ids:
            return 0
        with translate_errors("XDEL", f"{self._stream_key!r} at {self._where}"):
            return int(self._redis.xdel(self._stream_key, *ids))

    def delete_stream(self) -> int:
        """Delete the whole stream, its groups included; 1 if it existed."""
        with translate_errors("DEL", f"{self._stream_key!r} at {self._where}"):
            return int(self._redis.delete(self._stream_key))

    def trim(
        self, *, maxlen: int | None = None, minid: str | None = None, approximate: bool = False
    ) -> int:
        """Explicit trimming (XTRIM MAXLEN or MINID); return the number removed.

        This removes entries unread or pending; see :func:`rqse.trim.trim_acknowledged`
        for the safe policy.
        """
        if (maxlen is None) == (minid is None):
            raise ValueError("give exactly one of maxlen= and minid=")
        with translate_errors("XTRIM", f"{self._stream_key!r} at {self._where}"):
            return int(
                self._redis.xtrim(
                    self._stream_key, maxlen=maxlen, minid=minid, approximate=approximate
                )
            )

    # -- reading -------------------------------------------------------------------
    def read(self, count: int = 1, after: str = "0") -> list[StreamEntry]:
        """Up to ``count`` entries with ids greater than ``after`` (XREAD, no group)."""
        with translate_errors("XREAD", f"{self._stream_key!r} at {self._where}"):
            reply: Any = self._redis.xread({self._stream_key: after}, count=count)
        for _, entries in stream_items(reply):
            return self._decode(entries)
        return []

    def range(
        self, start: str = "-", finish: str = "+", count: int | None = 1
    ) -> list[StreamEntry]:
        """Entries with ids in [start, finish] (XRANGE); ``count=None`` for all.

        ``count`` defaults to 1 as in rqse 0.5.
        """
        with translate_errors("XRANGE", f"{self._stream_key!r} at {self._where}"):
            entries: Any = self._redis.xrange(self._stream_key, start, finish, count)
        return self._decode(entries)

    def __len__(self) -> int:
        with translate_errors("XLEN", f"{self._stream_key!r} at {self._where}"):
            return int(self._redis.xlen(self._stream_key))

    def len(self) -> int:
        """Number of entries in the stream (same as ``len(client)``)."""
        return self.__len__()

    def _decode(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> list[StreamEntry]:
        result = []
        for raw_id, fields in entries:
            entry_id = raw_id.decode()
            result.append((entry_id, decode_fields(fields, entry_id, kind_field=None)))
        return result

    # -- lifetime ------------------------------------------------------------------
    def close(self) -> None:
        """Disconnect the pool if this client created it."""
        if self._own_pool:
            self._pool.disconnect()

    def __enter__(self) -> EventClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._stream_key!r} at {self._where})"


def scan_entries(
    client: redis.Redis, stream: str, page: int = 1000
) -> Iterator[tuple[bytes, dict[bytes, bytes]]]:
    """Every entry of ``stream`` as stored (raw id, raw fields), oldest first, read a
    page at a time: memory stays one page however long the stream is."""
    start = "-"
    while True:
        rows: Any = client.xrange(stream, start, "+", count=page)
        yield from rows
        if len(rows) < page:
            return
        start = "(" + rows[-1][0].decode()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _pool_location(pool: redis.ConnectionPool) -> str:
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    return f"redis://{kwargs.get('host', '127.0.0.1')}:{kwargs.get('port', 6379)}"
