"""Who may do what: bearer tokens with a role, and the console's cookie.

Tokens come from a file (``--token-file``) or ``FLOWSTREAM_API_TOKENS``, one per
line (the variable: separated by commas or new lines), each ``ROLE:TOKEN`` with
ROLE ``read`` (every GET) or ``operate`` (also starts and actions); blank lines
and ``#`` comments are skipped. A request carries its token as
``Authorization: Bearer TOKEN`` or in the ``flowstream_session`` cookie that
``POST /api/session`` sets. Tokens are compared in constant time
(:func:`hmac.compare_digest`) against every known token, and never logged.

A browser sends the cookie with any request to this origin, also one a hostile
page makes it send; SameSite=Strict stops most of those, and a state-changing
request authenticated by the cookie must also carry ``X-Flowstream: 1``, a
header no cross-site form can set (a cross-origin script cannot either without
a CORS preflight, which is refused unless ``--cors-origin`` allows it).
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request

from flowstream.api.problems import Problem
from lifecycle.errors import LifecycleError

__all__ = [
    "COOKIE",
    "CSRF_HEADER",
    "OPERATE",
    "READ",
    "TOKENS_ENV",
    "Tokens",
    "role_of",
]

READ = "read"
OPERATE = "operate"
ROLES = (READ, OPERATE)
COOKIE = "flowstream_session"
CSRF_HEADER = "X-Flowstream"
TOKENS_ENV = "FLOWSTREAM_API_TOKENS"
MIN_TOKEN = 16  # characters: shorter tokens are refused (guessable)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class TokenError(LifecycleError):
    """Raised when the token file or variable cannot be read or has a bad line."""


@dataclass(frozen=True)
class Tokens:
    """The known tokens, each with its role."""

    entries: tuple[tuple[bytes, str], ...]

    @classmethod
    def parse(cls, text: str, where: str) -> Tokens:
        entries = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            role, colon, token = line.partition(":")
            role, token = role.strip(), token.strip()
            if not colon or role not in ROLES:
                raise TokenError(
                    f"{where}: line {number}: expected ROLE:TOKEN with ROLE read or operate "
                    f"(got role {role!r})"
                )
            if not (token.isascii() and token.isprintable()) or " " in token:
                raise TokenError(
                    f"{where}: line {number}: the {role} token must be printable ASCII "
                    "without spaces (it travels in an HTTP header)"
                )
            if len(token) < MIN_TOKEN:
                raise TokenError(
                    f"{where}: line {number}: the {role} token has {len(token)} characters, "
                    f"expected at least {MIN_TOKEN}"
                )
            entries.append((token.encode(), role))
        if not entries:
            raise TokenError(f"{where}: no token (lines read:TOKEN or operate:TOKEN)")
        return cls(tuple(entries))

    @classmethod
    def load(cls, token_file: str | None) -> Tokens | None:
        """From ``token_file``, else ``FLOWSTREAM_API_TOKENS``; None when neither is given."""
        if token_file:
            try:
                text = Path(token_file).read_text(encoding="utf-8")
            except OSError as error:
                raise TokenError(f"cannot read {token_file}: {error.strerror}") from None
            except UnicodeDecodeError:
                raise TokenError(f"{token_file}: not UTF-8 text") from None
            return cls.parse(text, token_file)
        variable = os.environ.get(TOKENS_ENV)
        # One line is hard to put in a variable: commas separate its tokens too.
        return cls.parse(variable.replace(",", "\n"), TOKENS_ENV) if variable else None

    def role(self, token: str) -> str | None:
        """The role of ``token``, None for an unknown one; every entry is compared, each
        in constant time, so the time taken says nothing of which matched."""
        given = token.encode()
        found = None
        for known, role in self.entries:
            if hmac.compare_digest(known, given) and found is None:
                found = role
        return found


def role_of(request: Request, tokens: Tokens | None) -> str:
    """The caller's role (:data:`OPERATE` without auth); 401 without a valid token, 403
    for a cookie-authenticated change without the CSRF header."""
    if tokens is None:
        _local_only(request)
        return OPERATE
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("Authorization: expected 'Bearer TOKEN'")
        role = tokens.role(token.strip())
        if role is None:
            raise _unauthorized("the bearer token is not one this server knows")
        return role
    cookie = request.cookies.get(COOKIE)
    if cookie is None:
        raise _unauthorized(
            "no token: send 'Authorization: Bearer TOKEN' or log in (POST /api/session)"
        )
    role = tokens.role(cookie)
    if role is None:
        raise _unauthorized("the session is no longer valid: log in again")
    if request.method not in SAFE_METHODS and request.headers.get(CSRF_HEADER) != "1":
        raise Problem(
            403, f"a change made with the session cookie needs the header {CSRF_HEADER}: 1"
        )
    return role


_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _local_only(request: Request) -> None:
    """Without tokens the server binds loopback only, but a browser on this machine can
    still be made to call it: by a page of any site (a change needs the header
    :data:`CSRF_HEADER`, which no page of another origin can send without the CORS
    preflight this server refuses) or through DNS rebinding (the Host must be a loopback
    name)."""
    host = request.headers.get("host", "")
    name = host[1:].partition("]")[0] if host.startswith("[") else host.rpartition(":")[0] or host
    if name not in _LOOPBACK_HOSTS:
        raise Problem(403, f"Host {host!r}: this server without tokens answers loopback names only")
    if request.method not in SAFE_METHODS and request.headers.get(CSRF_HEADER) != "1":
        raise Problem(
            403, f"a change needs the header {CSRF_HEADER}: 1 (against cross-site requests)"
        )


def _unauthorized(detail: str) -> Problem:
    return Problem(401, detail, {"WWW-Authenticate": "Bearer"})
