"""HTTP resources against real servers on loopback: which addresses are reached, redirects,
the body cap and the one deadline of a request."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from flowlang.limits import Limits
from rqse.connection import mask_url
from tests.workers.http_servers import (
    Site,
    body,
    drip,
    endless,
    redirect,
    self_signed,
    serve,
    server_context,
)
from workers.errors import ResourceError
from workers.resource_http import address_refusal, parse_networks, request
from workers.resources import Resources, load_resource, store_resource

LOOPBACK = ["127.0.0.0/8"]


@pytest.fixture
def site() -> Iterator[Site]:
    pages = Site()
    pages.routes.update(
        {
            "/data": body(b'{"rows": [1, 2]}', "application/json; charset=utf-8"),
            "/config": body(b"name: x\nlist: [1, 2]\n", "application/yaml"),
            "/put.yaml": body(b"", status=204),
        }
    )
    with serve(pages) as served:
        yield served


def resources(**settings: Any) -> Resources:
    settings.setdefault("allow_networks", LOOPBACK)
    return Resources.configure(**settings)


def test_an_allowed_network_is_reached_for_sources_and_sinks(site: Site) -> None:
    assert load_resource(f"{site.url}/data", allow_networks=LOOPBACK) == {"rows": [1, 2]}
    assert load_resource(f"{site.url}/config", allow_networks=LOOPBACK) == {
        "name": "x",
        "list": [1, 2],
    }
    store_resource(f"{site.url}/put.yaml", {"k": 1}, allow_networks=LOOPBACK)
    method, _, headers, sent = site.requests[-1]
    assert method == "PUT" and headers["Content-Type"] == "application/yaml"
    assert yaml.safe_load(sent) == {"k": 1}


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_loopback_is_refused_without_an_allowed_network_and_never_contacted(
    site: Site, host: str
) -> None:
    url = site.url.replace("127.0.0.1", host)
    with pytest.raises(ResourceError, match=r"GET refused: .* resolves to loopback address"):
        load_resource(f"{url}/data")
    with pytest.raises(ResourceError, match=r"PUT refused: .* resolves to loopback address"):
        store_resource(f"{url}/put.yaml", {"k": 1})
    assert site.requests == []


def test_a_redirect_to_a_refused_address_is_refused_before_it_is_followed() -> None:
    inner, outer = Site(), Site()
    inner.routes["/secret"] = body(b'{"secret": true}')
    with serve(inner, "127.0.0.1"), serve(outer, "127.0.0.2"):
        outer.routes["/go"] = redirect(f"{inner.url}/secret")
        with pytest.raises(ResourceError) as caught:
            load_resource(f"{outer.url}/go", allow_networks=["127.0.0.2/32"])
    message = str(caught.value)
    assert f"redirected to {inner.url}/secret" in message
    assert "resolves to loopback address 127.0.0.1" in message
    assert outer.paths() == ["/go"] and inner.requests == []


def _chain(site: Site, length: int) -> None:
    for n in range(1, length + 1):
        site.routes[f"/hop/{n}"] = redirect(f"/hop/{n - 1}", status=307 if n % 2 else 301)
    site.routes["/hop/0"] = body(b'{"arrived": true}')


def test_five_redirects_are_followed_and_a_sixth_is_refused(site: Site) -> None:
    _chain(site, 6)
    assert load_resource(f"{site.url}/hop/5", allow_networks=LOOPBACK) == {"arrived": True}
    site.requests.clear()
    with pytest.raises(ResourceError, match="refused: more than 5 redirects"):
        load_resource(f"{site.url}/hop/6", allow_networks=LOOPBACK)
    assert "/hop/0" not in site.paths() and len(site.requests) == 6


def test_a_redirect_to_another_scheme_is_refused(site: Site) -> None:
    site.routes["/file"] = redirect("file:///etc/passwd")
    with pytest.raises(ResourceError, match="refused: scheme 'file'"):
        load_resource(f"{site.url}/file", allow_networks=LOOPBACK)


def test_a_303_after_a_put_is_followed_with_a_get_without_the_body(site: Site) -> None:
    site.routes["/store"] = redirect("/data", status=303)
    resources().store(f"{site.url}/store", {"k": 1}, {"format": "json"})
    (put, _, _, sent), (get, path, headers, empty) = site.requests
    assert (put, orjson.loads(sent)) == ("PUT", {"k": 1})
    assert (get, path, empty) == ("GET", "/data", b"")
    assert "Content-Type" not in headers


def test_a_body_over_the_cap_is_refused_while_reading_not_after(site: Site) -> None:
    site.routes["/endless"] = endless(site)
    started = time.monotonic()
    small = Limits(value_bytes=64 * 1024)
    with pytest.raises(ResourceError, match="body exceeds the limit of 65,536 bytes"):
        resources(limits=small).load(f"{site.url}/endless")
    assert time.monotonic() - started < 5
    # The server's writes stop once the client leaves: far less than an endless body.
    time.sleep(0.2)
    assert site.sent < 64 * 1024 * 1024


def test_a_declared_length_over_the_cap_is_refused_before_reading_the_body(site: Site) -> None:
    site.routes["/declared"] = endless(site, declared=100 * 1024 * 1024)
    with pytest.raises(ResourceError, match="body of 104,857,600 bytes, more than the limit"):
        resources(limits=Limits(value_bytes=1024)).load(f"{site.url}/declared")


@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "headers"])
def test_a_server_dripping_bytes_hits_the_total_deadline(site: Site, headers_too: bool) -> None:
    site.routes["/drip"] = drip(site, interval=0.02, headers_too=headers_too)
    started = time.monotonic()
    with pytest.raises(ResourceError, match=r"GET failed: deadline of 0\.5 s exceeded"):
        resources(http_deadline=0.5).load(f"{site.url}/drip")
    elapsed = time.monotonic() - started
    assert 0.45 < elapsed < 3
    assert site.sent > 5  # bytes kept coming: each read alone was quick


def test_the_timeout_parameter_shortens_the_deadline_but_cannot_extend_it(site: Site) -> None:
    site.routes["/drip"] = drip(site, interval=0.02)
    started = time.monotonic()
    with pytest.raises(ResourceError, match=r"deadline of 0\.3 s exceeded"):
        resources(http_deadline=5).load(f"{site.url}/drip", {"timeout": 0.3})
    assert time.monotonic() - started < 1.5
    with pytest.raises(ResourceError, match=r"deadline of 0\.3 s exceeded"):
        resources(http_deadline=0.3).load(f"{site.url}/drip", {"timeout": 60})


def test_a_password_in_the_url_is_masked_in_errors_and_sent_as_basic_auth(site: Site) -> None:
    url = site.url.replace("http://", "http://ann:s3cret@")
    with pytest.raises(ResourceError) as refused:
        load_resource(f"{url}/data")
    assert "ann:***@127.0.0.1" in str(refused.value) and "s3cret" not in str(refused.value)
    with pytest.raises(ResourceError, match="GET answered 404 Not Found") as missing:
        resources().load(f"{url}/missing")
    assert "s3cret" not in str(missing.value)
    assert site.requests[-1][2]["Authorization"] == "Basic YW5uOnMzY3JldA=="
    assert mask_url("https://u:p@h/x?q") == "https://u:***@h/x?q"


def test_a_password_a_url_parser_would_misread_is_masked_all_the_same() -> None:
    """An unescaped ``/`` in a password ends the host part for a URL parser, which
    then finds no password; a token given as the user name is a secret too."""
    with pytest.raises(ResourceError) as refused:
        load_resource("https://u:s3c/ret@example.com/x")
    assert "s3c" not in str(refused.value) and "u:***@example.com/x" in str(refused.value)
    assert mask_url("https://tok_ABCDEF@example.com/") == "https://***@example.com/"


def test_a_resolver_answer_changing_after_the_check_cannot_redirect_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checked, rebound = Site(), Site()
    checked.routes["/data"] = body(b'{"from": "checked"}')
    rebound.routes["/data"] = body(b'{"from": "rebound"}')
    with serve(checked, "127.0.0.2"), serve(rebound, "127.0.0.1"):
        port = int(checked.url.rsplit(":", 1)[1])
        real = socket.getaddrinfo
        asked: list[str] = []

        def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
            # A DNS server that answers the checked address first and a refused one after.
            if host == "rebind.test":
                asked.append(host)
                host = "127.0.0.2" if len(asked) == 1 else "127.0.0.1"
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", rebinding)
        got = load_resource(f"http://rebind.test:{port}/data", allow_networks=["127.0.0.2/32"])
    assert got == {"from": "checked"}
    assert asked == ["rebind.test"] and rebound.requests == []
    assert checked.requests[0][2]["Host"] == f"rebind.test:{port}"


def test_an_unresolvable_host_is_one_line(site: Site) -> None:
    with pytest.raises(ResourceError, match=r"^http://nowhere\.invalid/x: GET cannot resolve"):
        load_resource("http://nowhere.invalid/x")


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("100.64.0.1", "special-purpose"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("192.0.2.1", "private"),  # documentation range
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("fe80::1", "link-local"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "embeds loopback address 127.0.0.1"),
        ("::ffff:169.254.169.254", "embeds link-local address 169.254.169.254"),
        ("::ffff:100.64.0.1", "embeds special-purpose"),
        ("2002:7f00:1::", "embeds loopback address 127.0.0.1"),  # 6to4
        ("64:ff9b::a00:1", "embeds private address 10.0.0.1"),  # NAT64
    ],
)
def test_non_public_addresses_are_refused_with_their_kind(address: str, kind: str) -> None:
    refusal = address_refusal(ipaddress.ip_address(address))
    assert refusal is not None and kind in refusal


@pytest.mark.parametrize("address", ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address)) is None


def test_allowed_networks_admit_their_addresses_and_their_mapped_forms_only() -> None:
    allowed = parse_networks(["10.0.0.0/8", "fd00::/8"])
    for address in ("10.9.8.7", "::ffff:10.9.8.7", "fd00::5"):
        assert address_refusal(ipaddress.ip_address(address), allowed) is None
    for address in ("192.168.0.1", "127.0.0.1", "::ffff:127.0.0.1", "fc00::1"):
        assert address_refusal(ipaddress.ip_address(address), allowed) is not None


def test_a_bad_allowed_network_is_one_clear_line() -> None:
    with pytest.raises(ValueError, match=r"allowed network '10\.0\.0\.1/8': .*expected CIDR"):
        parse_networks(["10.0.0.1/8"])
    with pytest.raises(ValueError, match="allowed network 'nope'"):
        Resources.configure(allow_networks=["nope"])


def test_https_connects_to_the_checked_address_and_verifies_the_host_name(
    tmp_path: Path,
) -> None:
    cert, key = self_signed(tmp_path, "localhost")
    trusted = ssl.create_default_context(cafile=str(cert))
    pages = Site()
    pages.routes["/data"] = body(b'{"secure": true}')
    with serve(pages, "127.0.0.1", tls=server_context(cert, key)):
        port = pages.url.rsplit(":", 1)[1]
        settings: dict[str, Any] = {"limit": 1024, "deadline": 5, "tls": trusted}
        loopback = parse_networks(LOOPBACK)
        got = request(f"https://localhost:{port}/data", allow_networks=loopback, **settings)
        assert orjson.loads(got.body) == {"secure": True}
        assert pages.requests[0][2]["Host"] == f"localhost:{port}"
        # The same server by address: the certificate names localhost, not 127.0.0.1.
        with pytest.raises(ResourceError, match=r"GET failed: TLS: .*CERTIFICATE_VERIFY_FAILED"):
            request(f"{pages.url}/data", allow_networks=loopback, **settings)
        # The deadline's watchdog cuts a TLS connection as it cuts a plain one.
        pages.routes["/drip"] = drip(pages, interval=0.02)
        started = time.monotonic()
        with pytest.raises(ResourceError, match=r"deadline of 0\.4 s exceeded"):
            request(
                f"https://localhost:{port}/drip",
                allow_networks=loopback,
                **settings | {"deadline": 0.4, "limit": 1 << 20},
            )
        assert time.monotonic() - started < 3


def test_paths_are_percent_encoded_and_a_header_with_a_line_break_is_refused(site: Site) -> None:
    site.routes["/a%20b/%C3%A9?q=%C3%A9"] = body(b"[1]")
    assert resources().load(f"{site.url}/a b/é?q=é") == [1]
    with pytest.raises(ResourceError, match=r"/data: GET failed: Invalid header value"):
        resources().load(f"{site.url}/data", {"headers": {"X-A": "1\r\nX-Injected: 1"}})
    assert [path for path in site.paths() if path == "/data"] == []


@pytest.mark.parametrize("host", ["127.1", "0x7f000001", "2130706433", "[::ffff:127.0.0.1]"])
def test_other_spellings_of_loopback_are_refused_too(site: Site, host: str) -> None:
    port = site.url.rsplit(":", 1)[1]
    with pytest.raises(ResourceError, match=r"GET refused: .*(loopback address 127\.0\.0\.1)"):
        load_resource(f"http://{host}:{port}/data")
    assert site.requests == []
