"""Where Redis is: URL resolution, connection pools and error translation.

Resolution order, first match wins (read when a client is constructed, never
at import):

1. an explicit ``url`` (``redis://``, ``rediss://`` or ``unix://``);
2. an explicit ``host`` and/or ``port`` (the seed's keyword arguments);
3. the ``REDIS_URL`` environment variable;
4. ``REDIS_HOST`` / ``REDIS_PORT`` (the seed's variables);
5. ``redis://127.0.0.1:6379``.

Credentials: explicit ``username``/``password`` arguments win over those in
the URL, which win over ``REDIS_USERNAME``/``REDIS_PASSWORD``. Passwords never
appear in logs or error messages: use :func:`mask_url`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.connection import parse_url

from rqse.errors import ConfigurationError, RedisCommandError, RedisUnavailable

__all__ = [
    "DEFAULT_URL",
    "RedisSettings",
    "is_transient",
    "mask_url",
    "translate_errors",
]

DEFAULT_URL = "redis://127.0.0.1:6379"
SCHEMES = ("redis", "rediss", "unix")

# Pool defaults. socket_timeout bounds every reply, so a listener's BLOCK time
# must stay below it (checked by EventListener); keepalive finds dead peers.
POOL_DEFAULTS: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "socket_timeout": 30.0,
    "socket_keepalive": True,
}


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe to log)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _check_scheme(url: str, origin: str) -> None:
    if "://" not in url:
        raise ConfigurationError(
            f"Redis URL {mask_url(url)!r} from {origin} has no scheme "
            "(expected redis://, rediss:// or unix://; pass host= for a bare host name)"
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"unsupported Redis URL scheme {scheme!r} from {origin} "
            "(expected redis://, rediss:// or unix://)"
        )


@dataclass(frozen=True)
class RedisSettings:
    """A resolved Redis location; ``password`` is kept out of ``repr``."""

    url: str
    origin: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def resolve(
        cls,
        url: str | None = None,
        host: str | None = None,
        port: int | str | None = None,
        username: str | None = None,
        password: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> RedisSettings:
        """Apply the resolution order of this module; ``env`` defaults to ``os.environ``."""
        env = os.environ if env is None else env
        if url is not None and (host is not None or port is not None):
            raise ConfigurationError(
                f"give either url= ({mask_url(url)!r}) or host=/port= ({host!r}, {port!r}), "
                "not both"
            )
        if url is not None:
            chosen, origin = url, "the url argument"
        elif host is not None or port is not None:
            chosen, origin = _host_url(host or "127.0.0.1", port or 6379), "host=/port= arguments"
        elif env.get("REDIS_URL"):
            chosen, origin = env["REDIS_URL"], "REDIS_URL"
        elif env.get("REDIS_HOST") or env.get("REDIS_PORT"):
            chosen = _host_url(env.get("REDIS_HOST") or "127.0.0.1", env.get("REDIS_PORT") or 6379)
            origin = "REDIS_HOST/REDIS_PORT"
        else:
            chosen, origin = DEFAULT_URL, "the default"
        _check_scheme(chosen, origin)
        in_url = urlsplit(chosen)
        if username is None and not in_url.username:
            username = env.get("REDIS_USERNAME") or None
        if password is None and not in_url.password:
            password = env.get("REDIS_PASSWORD") or None
        return cls(url=chosen, origin=origin, username=username, password=password)

    @property
    def masked_url(self) -> str:
        return mask_url(self.url)

    def pool(self, **options: Any) -> redis.ConnectionPool:
        """A new connection pool; ``options`` override :data:`POOL_DEFAULTS`."""
        try:
            url_options = parse_url(self.url)  # type: ignore[no-untyped-call]
        except ValueError as e:
            raise ConfigurationError(f"invalid Redis URL {self.masked_url!r}: {e}") from e
        kwargs = {**POOL_DEFAULTS, **url_options, **options}
        if url_options.get("connection_class") is redis.UnixDomainSocketConnection:
            kwargs.pop("socket_keepalive", None)  # not a TCP option
        if self.username is not None:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        return redis.ConnectionPool(**kwargs)


def _host_url(host: str, port: int | str) -> str:
    try:
        number = int(port)
    except ValueError as e:
        raise ConfigurationError(f"Redis port {port!r} is not a number") from e
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    return f"redis://{host}:{number}"


# Reply prefixes of errors that go away by themselves (failover, script kill).
_TRANSIENT_PREFIXES = ("LOADING ", "BUSY ", "MASTERDOWN ", "TRYAGAIN ", "READONLY ")


def is_transient(error: BaseException) -> bool:
    """True for Redis errors worth a reconnect-and-retry rather than a crash."""
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError, RedisUnavailable)):
        return True
    if isinstance(error, redis.ResponseError):
        return str(error).startswith(_TRANSIENT_PREFIXES)
    return False


@contextmanager
def translate_errors(action: str, where: str) -> Iterator[None]:
    """Re-raise redis-py errors as rqse errors, naming the action and the key/URL."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise RedisUnavailable(f"{action} on {where}: Redis unavailable: {e}") from e
    except redis.RedisError as e:
        raise RedisCommandError(f"{action} on {where}: {e}") from e
