"""HTTP(S) of resource tasks: requests a flow author names, made safe for the worker's network.

A flow's URI is untrusted, and the worker usually sits inside a network with
services and cloud metadata endpoints nobody meant to expose. So each request:

* resolves the host once and refuses it if any address it resolves to is not
  public (loopback, private, ULA, link-local and the metadata address
  169.254.169.254, multicast, unspecified, reserved, CGNAT, and IPv6 forms that
  embed such an IPv4 address), unless the address is inside one of the
  operator's ``allow_networks``;
* connects to that checked address, not to the name again (a DNS answer that
  changes between the check and the connection cannot swap it); TLS still
  verifies the certificate against the host name;
* follows at most :data:`MAX_REDIRECTS` redirects, each hop checked the same way;
* stops reading the body past ``limit`` bytes, and gives up at one deadline
  shared by resolution, connections, redirects and the body (a watchdog shuts
  the socket, so a server dripping a byte at a time cannot stretch it).

Proxies from the environment are not used: a proxy would resolve the name itself.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.client
import ipaddress
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rqse.connection import mask_url
from workers.errors import ResourceError

__all__ = [
    "MAX_REDIRECTS",
    "Network",
    "Response",
    "address_refusal",
    "parse_networks",
    "request",
]

MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 1 << 16
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # IPv4 addresses translated into IPv6

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str | None


def parse_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """The networks of ``cidrs`` (``10.0.0.0/8``, ``fd00::/8``); ValueError naming a bad one."""
    networks = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(str(cidr).strip(), strict=True))
        except ValueError as error:
            raise ValueError(
                f"allowed network {cidr!r}: {error} (expected CIDR like 10.0.0.0/8)"
            ) from None
    return tuple(networks)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, Teredo, NAT64), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _non_public(address: Address) -> str | None:
    """What kind of non-public address ``address`` is, or None if it is public."""
    for kind, test in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
    ):
        if test:
            return kind
    if not address.is_global:  # CGNAT 100.64/10 and other special-purpose ranges
        return "special-purpose (not globally routable)"
    return None


def address_refusal(address: Address, allowed: Sequence[Network] = ()) -> str | None:
    """Why a request may not go to ``address``, or None when it may: a public address,
    or one inside an ``allowed`` network."""
    if any(address in network for network in allowed if network.version == address.version):
        return None
    embedded = _embedded_ipv4(address) if isinstance(address, ipaddress.IPv6Address) else None
    if embedded is not None:
        if any(embedded in network for network in allowed if network.version == 4):
            return None
        kind = _non_public(embedded)
        if kind is not None:
            return f"address {address}, which embeds {kind} address {embedded}"
    kind = _non_public(address)
    return None if kind is None else f"{kind} address {address}"


class _Deadline:
    """One deadline for a whole request; a watchdog shuts the current socket at expiry."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._timer: threading.Timer | None = None
        self.expired = False

    def remaining(self) -> float:
        left = self._end - time.monotonic()
        if left <= 0 or self.expired:
            self.expired = True
            raise TimeoutError(f"deadline of {self.seconds:g} s exceeded")
        return left

    def watch(self, sock: socket.socket) -> None:
        """Shut ``sock`` down at the deadline. A duplicate descriptor is watched, so the
        caller may wrap ``sock`` in TLS (shutdown acts on the connection, not the fd)."""
        self.release()
        with self._lock:
            self._socket = sock.dup()
            self._timer = threading.Timer(self.remaining(), self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            if self._socket is not None:
                # OSError: already closed by the peer or by us.
                with contextlib.suppress(OSError):
                    self._socket.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._socket is not None:
                self._socket.close()
                self._socket = None


def _resolve(host: str, port: int, deadline: _Deadline) -> list[Address]:
    """Every address ``host`` resolves to; getaddrinfo has no timeout, so it runs in a
    thread that is abandoned at the deadline."""
    try:  # an address literal needs no lookup (and no thread)
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    found: list[Any] = []
    failure: list[BaseException] = []

    def lookup() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except BaseException as error:  # handed to the caller's thread
            failure.append(error)

    thread = threading.Thread(target=lookup, name=f"resolve {host}", daemon=True)
    thread.start()
    thread.join(deadline.remaining())
    if thread.is_alive():
        deadline.remaining()  # raises once expired; join returned early only at the deadline
        raise TimeoutError(f"resolving {host} took too long")
    if failure:
        error = failure[0]
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise ResourceError(f"cannot resolve {host}: {reason}")
    addresses: list[Address] = []
    for _family, _type, _proto, _name, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise ResourceError(f"cannot resolve {host}: no address")
    return addresses


class _PinnedConnection(http.client.HTTPConnection):
    """An HTTP(S) connection to one checked address, whatever the host name resolves to now."""

    def __init__(
        self,
        host: str,
        port: int,
        addresses: Sequence[Address],
        deadline: _Deadline,
        tls: ssl.SSLContext | None,
    ) -> None:
        super().__init__(host, port, timeout=deadline.remaining())
        self.default_port = 443 if tls is not None else 80  # Host header without :443
        self._addresses = addresses
        self._deadline = deadline
        self._tls = tls

    def connect(self) -> None:
        sock = self._first_answering()
        try:
            self._deadline.watch(sock)
            sock.settimeout(self._deadline.remaining())
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def _first_answering(self) -> socket.socket:
        """A socket to the first checked address that accepts (all of them were checked)."""
        failure: OSError | None = None
        for address in self._addresses:
            try:
                return socket.create_connection(
                    (str(address), self.port), self._deadline.remaining()
                )
            except TimeoutError:
                raise
            except OSError as error:
                failure = error
        assert failure is not None  # _resolve never returns an empty list
        raise failure


@dataclass(slots=True)
class _Request:
    url: str
    method: str
    headers: dict[str, str]
    body: bytes | None
    hops: list[str] = field(default_factory=list)


def _target(url: str) -> tuple[urllib.parse.SplitResult, str, int]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ResourceError(f"refused: scheme {scheme!r} (only http and https are fetched)")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number or out of range
        # (Not the parser's words: they quote the "port", which may be a password's
        # part where the password holds an unescaped "/".)
        raise ResourceError("refused: bad address: its port is not a number to 65535") from None
    if not host:
        raise ResourceError("refused: no host in the URL")
    try:  # an international name travels as ASCII (IDNA), in DNS and in the Host header
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise ResourceError(f"refused: host {host!r} is not a valid name") from None
    return parts, host, port or (443 if scheme == "https" else 80)


# RFC 3986 characters a path or query keeps as they are; anything else (spaces,
# non-ASCII) is percent-encoded, as a browser would send it.
_PATH_SAFE = "/%:@!$&'()*+,;=~"


def _request_target(parts: urllib.parse.SplitResult) -> str:
    target = urllib.parse.quote(parts.path or "/", safe=_PATH_SAFE)
    if parts.query:
        target += "?" + urllib.parse.quote(parts.query, safe=_PATH_SAFE + "?")
    return target


def _auth_header(parts: urllib.parse.SplitResult) -> str | None:
    if parts.username is None:
        return None
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def _read_body(response: http.client.HTTPResponse, limit: int, deadline: _Deadline) -> bytes:
    declared = response.getheader("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ResourceError(f"body of {int(declared):,} bytes, more than the limit of {limit:,}")
    chunks: list[bytes] = []
    size = 0
    while True:
        deadline.remaining()
        # read1: one socket read at most, so the deadline is checked between reads.
        chunk = response.read1(_CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise ResourceError(f"body exceeds the limit of {limit:,} bytes (stopped reading)")
        chunks.append(chunk)
    deadline.remaining()  # a watchdog shutdown looks like an early end of the body
    return b"".join(chunks)


def _exchange(
    current: _Request,
    allowed: Sequence[Network],
    limit: int,
    deadline: _Deadline,
    tls: ssl.SSLContext,
) -> tuple[Response, str | None]:
    """One request to one checked address: (response, Location of a redirect or None)."""
    parts, host, port = _target(current.url)
    addresses = _resolve(host, port, deadline)
    for address in addresses:
        refusal = address_refusal(address, allowed)
        if refusal is not None:
            raise ResourceError(
                f"refused: {host} resolves to {refusal} (outside the allowed networks)"
            )
    secure = tls if parts.scheme.lower() == "https" else None
    connection = _PinnedConnection(host, port, addresses, deadline, secure)
    headers = dict(current.headers)
    auth = _auth_header(parts)
    if auth is not None:
        headers.setdefault("Authorization", auth)
    try:
        connection.request(
            current.method, _request_target(parts), body=current.body, headers=headers
        )
        response = connection.getresponse()
        location = response.getheader("Location")
        if response.status in _REDIRECTS and location:
            return Response(response.status, b"", None), location
        body = _read_body(response, limit, deadline)
        return Response(response.status, body, response.getheader("Content-Type")), None
    finally:
        connection.close()
        deadline.release()


def _follow(current: _Request, status: int, location: str) -> _Request:
    """The request a redirect asks for: 303 (and 301/302 after POST) becomes a GET; the
    credentials stay behind when the redirect leaves the origin."""
    url = urllib.parse.urljoin(current.url, location)
    method, body = current.method, current.body
    if status == 303 or (status in (301, 302) and method == "POST"):
        method, body = "GET", None
    headers = dict(current.headers)
    if body is None:
        headers.pop("Content-Type", None)
    old, new = urllib.parse.urlsplit(current.url), urllib.parse.urlsplit(url)
    if (old.scheme, old.netloc) != (new.scheme, new.netloc):
        for name in [h for h in headers if h.lower() in ("authorization", "cookie")]:
            del headers[name]
    return _Request(url, method, headers, body, [*current.hops, current.url])


@functools.cache
def _default_tls() -> ssl.SSLContext:
    """The system's trusted CAs and host name checks; loaded once (contexts are thread-safe)."""
    return ssl.create_default_context()


def request(
    url: str,
    method: str = "GET",
    *,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    allow_networks: Sequence[Network] = (),
    limit: int,
    deadline: float,
    tls: ssl.SSLContext | None = None,
) -> Response:
    """One HTTP request with the checks of the module docstring. Any failure, and any
    final status other than 2xx, is a ResourceError of one line naming ``url`` (its
    password masked) and, after redirects, the hop that failed."""
    clock = _Deadline(deadline)
    current = _Request(url, method, dict(headers or {}), body)
    context = tls or _default_tls()
    try:
        while True:
            response, location = _exchange(current, allow_networks, limit, clock, context)
            if location is None:
                break
            if len(current.hops) >= MAX_REDIRECTS:
                raise ResourceError(f"refused: more than {MAX_REDIRECTS} redirects")
            current = _follow(current, response.status, location)
    except ResourceError as error:
        raise ResourceError(f"{_where(url, current)}: {current.method} {error}") from None
    except (OSError, http.client.HTTPException, ValueError) as error:
        # ValueError: http.client refusing a header value with a line break in it.
        raise ResourceError(
            f"{_where(url, current)}: {current.method} failed: {_reason(error, clock)}"
        ) from None
    if not 200 <= response.status < 300:
        reason = http.client.responses.get(response.status, "")
        raise ResourceError(
            f"{_where(url, current)}: {current.method} answered {response.status} {reason}".rstrip()
        )
    return response


def _reason(error: OSError | http.client.HTTPException | ValueError, clock: _Deadline) -> str:
    """One line for a failed exchange; any failure after the deadline passed is the deadline
    (the watchdog's shutdown surfaces as a reset or a short read)."""
    if clock.expired or isinstance(error, TimeoutError):
        return f"deadline of {clock.seconds:g} s exceeded"
    if isinstance(error, ssl.SSLError):
        return f"TLS: {error.reason or error}"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


def _where(url: str, current: _Request) -> str:
    """The URL for a message: the one asked for, and the hop reached if redirected."""
    if current.url == url:
        return mask_url(url)
    return f"{mask_url(url)} (redirected to {mask_url(current.url)})"
