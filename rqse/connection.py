"""Where Redis is: URL resolution, connection pools and error translation.

Resolution order, first match wins (read when a client is constructed, never
at import):

1. an explicit ``url`` (``redis://``, ``rediss://`` or ``unix://``), or
   ``url_file``: a file holding the URL (``--redis-url-file``), so that a
   password never has to be on a command line (where ``ps`` shows it);
2. an explicit ``host`` and/or ``port`` (the seed's keyword arguments);
3. the ``REDIS_URL`` environment variable, or ``REDIS_URL_FILE`` (a file, as above);
4. ``REDIS_HOST`` / ``REDIS_PORT`` (the seed's variables);
5. ``redis://127.0.0.1:6379``.

Credentials: explicit ``username``/``password`` arguments win over those in
the URL, which win over ``REDIS_USERNAME``/``REDIS_PASSWORD``. Passwords never
appear in logs or error messages: every URL printed goes through :func:`mask_url`.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import redis
from redis.connection import parse_url

from rqse.errors import ConfigurationError, RedisCommandError, RedisUnavailable
from rqse.weather import describe, is_weather

__all__ = [
    "DEFAULT_URL",
    "RedisSettings",
    "is_transient",
    "mask_url",
    "read_url_file",
    "redis_arguments",
    "resolve_url",
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


# A password in the query string (redis-py reads ?password=...).
_QUERY_SECRET = re.compile(r"([?&;](?:password|pass|pwd)=)([^&;]*)", re.IGNORECASE)


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (safe to log).

    Not parsed as a URL: a password may hold ``#``, ``/``, ``?``, ``@`` or ``%``
    unescaped, and a parser would then take part of it for the host, the path or
    the fragment and print it. Everything up to the last ``@`` after the scheme
    is credentials (a host name has no ``@``): ``user:***``, or ``***`` alone
    when there is no ``:`` (``redis://secret@host`` is a password more often
    than a user name). A ``password=`` query value is masked too.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    at = rest.rfind("@")
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        rest = f"{user}:***@{rest[at + 1 :]}" if colon else f"***@{rest[at + 1 :]}"
    rest = _QUERY_SECRET.sub(r"\1***", rest)
    return f"{scheme}{separator}{rest}"


def _secrets(url: str) -> list[str]:
    """The texts :func:`mask_url` hides, raw and unescaped (to scrub other messages)."""
    rest = url.partition("://")[2] or url
    found = []
    at = rest.rfind("@")
    if at >= 0:
        user, colon, password = rest[:at].partition(":")
        found.append(password if colon else user)
    found += [m.group(2) for m in _QUERY_SECRET.finditer(rest)]
    found = [text for text in found if text]
    found += [unquote(text) for text in found]
    return sorted(set(found), key=len, reverse=True)


def _credentials(url: str) -> tuple[str, str]:
    """(user, password) as written in ``url`` (empty when absent), split as
    :func:`mask_url` splits them."""
    rest = url.partition("://")[2]
    at = rest.rfind("@")
    if at < 0:
        return "", ""
    user, _, password = rest[:at].partition(":")
    return user, password


def scrub(text: str, url: str) -> str:
    """``text`` (a parser's or a library's message about ``url``) with the URL's
    secrets replaced by ``***``."""
    for secret in _secrets(url):
        text = text.replace(secret, "***")
    return text


def _check_scheme(url: str, origin: str) -> None:
    if "://" not in url:
        raise ConfigurationError(
            f"Redis URL {mask_url(url)!r} from {origin} has no scheme "
            "(expected redis://, rediss:// or unix://, e.g. redis://HOST:6379/0; for a bare "
            "host name set REDIS_HOST instead, or pass host= from Python)"
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"unsupported Redis URL scheme {scheme!r} from {origin} "
            "(expected redis://, rediss:// or unix://)"
        )


@dataclass(frozen=True)
class RedisSettings:
    """A resolved Redis location; ``repr`` shows the URL masked and no password."""

    url: str = field(repr=False)
    origin: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return (
            f"RedisSettings(url={self.masked_url!r}, origin={self.origin!r}, "
            f"username={self.username!r})"
        )

    @classmethod
    def resolve(
        cls,
        url: str | None = None,
        host: str | None = None,
        port: int | str | None = None,
        username: str | None = None,
        password: str | None = None,
        env: Mapping[str, str] | None = None,
        url_file: str | os.PathLike[str] | None = None,
        url_origin: str = "the url argument",
    ) -> RedisSettings:
        """Apply the resolution order of this module; ``env`` defaults to ``os.environ``.
        ``url_origin``: what messages call ``url`` (a CLI's ``--redis-url``)."""
        env = os.environ if env is None else env
        if url is not None and url_file is not None:
            raise ConfigurationError(
                f"give either a Redis URL ({mask_url(url)!r}) or a file holding one "
                f"({os.fspath(url_file)!r}), not both"
            )
        if (url is not None or url_file is not None) and (host is not None or port is not None):
            given = mask_url(url) if url is not None else os.fspath(url_file or "")
            raise ConfigurationError(
                f"give either url= ({given!r}) or host=/port= ({host!r}, {port!r}), not both"
            )
        if url is not None:
            chosen, origin = url, url_origin
        elif url_file is not None:
            origin = f"the file {os.fspath(url_file)!r}"
            chosen = read_url_file(url_file, origin)
        elif host is not None or port is not None:
            chosen, origin = _host_url(host or "127.0.0.1", port or 6379), "host=/port= arguments"
        elif env.get("REDIS_URL") and env.get("REDIS_URL_FILE"):
            raise ConfigurationError(
                "both REDIS_URL and REDIS_URL_FILE are set; set only one "
                f"(REDIS_URL_FILE={env['REDIS_URL_FILE']!r})"
            )
        elif env.get("REDIS_URL"):
            chosen, origin = env["REDIS_URL"], "REDIS_URL"
        elif env.get("REDIS_URL_FILE"):
            origin = f"REDIS_URL_FILE ({env['REDIS_URL_FILE']!r})"
            chosen = read_url_file(env["REDIS_URL_FILE"], origin)
        elif env.get("REDIS_HOST") or env.get("REDIS_PORT"):
            chosen = _host_url(env.get("REDIS_HOST") or "127.0.0.1", env.get("REDIS_PORT") or 6379)
            origin = "REDIS_HOST/REDIS_PORT"
        else:
            chosen, origin = DEFAULT_URL, "the default"
        _check_scheme(chosen, origin)
        url_user, url_password = _credentials(chosen)
        if username is None and not url_user:
            username = env.get("REDIS_USERNAME") or None
        if password is None and not url_password:
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
            # The parser's message may quote the URL's parts (a password taken for a port):
            # scrubbed, and not chained, as a traceback would print it whole.
            detail = scrub(str(e), self.url)
            if "'" in detail or '"' in detail:  # it quotes a part, maybe a piece of password
                detail = "it cannot be parsed"
            raise ConfigurationError(
                f"invalid Redis URL {self.masked_url!r} from {self.origin}: {detail} "
                "(a password holding '@', '/', '#', '?' or '%' must be percent-encoded)"
            ) from None
        kwargs = {**POOL_DEFAULTS, **url_options, **options}
        if url_options.get("connection_class") is redis.UnixDomainSocketConnection:
            kwargs.pop("socket_keepalive", None)  # not a TCP option
        if self.username is not None:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        return redis.ConnectionPool(**kwargs)


def read_url_file(path: str | os.PathLike[str], origin: str | None = None) -> str:
    """The Redis URL held in the file ``path`` (surrounding blank space dropped).

    Raises :class:`ConfigurationError` naming the file, never its content.
    """
    where = origin or f"the file {os.fspath(path)!r}"
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigurationError(f"cannot read the Redis URL from {where}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigurationError(f"the Redis URL in {where} is not UTF-8 text") from None
    if not text:
        raise ConfigurationError(f"{where} is empty (expected one Redis URL)")
    if "\n" in text:
        raise ConfigurationError(f"{where} holds several lines (expected one Redis URL)")
    return text


def resolve_url(
    url: str | None = None,
    url_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> RedisSettings:
    """What a CLI calls with its ``--redis-url`` and ``--redis-url-file`` values (either
    may be None): the resolved settings (``.pool()``, ``.masked_url``, ``.origin``),
    falling back to the environment (``REDIS_URL``, ``REDIS_URL_FILE``, ``REDIS_HOST``...).
    Raises :class:`ConfigurationError` with one printable line."""
    return RedisSettings.resolve(url=url, url_file=url_file, env=env, url_origin="--redis-url")


def redis_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--redis-url`` and ``--redis-url-file`` (mutually exclusive) to a CLI's
    parser, whose values go to :func:`resolve_url`, and ``--cluster``
    (``Connections.open(..., cluster=True)`` when given, detection when not)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--redis-url",
        metavar="URL",
        help="redis://, rediss:// or unix:// URL (a password here shows in ps: prefer a file)",
    )
    where.add_argument(
        "--redis-url-file",
        metavar="PATH",
        help="file holding the Redis URL (also REDIS_URL_FILE), e.g. a mounted secret",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        default=None,  # None when omitted: Connections.open(cluster=None) detects it
        help="Redis Cluster: route each partition to its master (detected when omitted)",
    )


def _host_url(host: str, port: int | str) -> str:
    try:
        number = int(port)
    except ValueError as e:
        raise ConfigurationError(f"Redis port {port!r} is not a number") from e
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    return f"redis://{host}:{number}"


def is_transient(error: BaseException) -> bool:
    """True for Redis errors worth a wait-and-retry rather than a crash: unreachable,
    out of memory, read-only, loading, MISCONF, busy, and a cluster's failover or
    resharding: MOVED, ASK, CLUSTERDOWN, TRYAGAIN, MASTERDOWN (:mod:`rqse.weather`)."""
    return is_weather(error)


@contextmanager
def translate_errors(action: str, where: str) -> Iterator[None]:
    """Re-raise redis-py errors as rqse errors, naming the action and the key/URL:
    passing conditions (:func:`is_transient`) as :class:`RedisUnavailable`, others as
    :class:`RedisCommandError`."""
    try:
        yield
    except redis.RedisError as e:
        if is_weather(e):
            raise RedisUnavailable(f"{action} on {where}: {describe(e)}") from e
        raise RedisCommandError(f"{action} on {where}: {e}") from e
