# TEMPORARY stand-in (single node only) until the cluster helper's module lands.
from __future__ import annotations
from typing import Any
import redis
from rqse.connection import RedisSettings

class Connections:
    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._pool = pool
        self.cluster = False

    @classmethod
    def open(cls, settings: RedisSettings, *, cluster: bool | None = None, **pool_options: Any) -> "Connections":
        return cls(settings.pool(**pool_options))

    def pool_for(self, key: str) -> redis.ConnectionPool:
        return self._pool

    def client_for(self, key: str) -> redis.Redis:
        return redis.Redis(connection_pool=self._pool)

    def masters(self) -> list[tuple[str, int]]:
        k = self._pool.connection_kwargs
        return [(k.get("host", ""), k.get("port", 0))]

    def close(self) -> None:
        self._pool.disconnect()
