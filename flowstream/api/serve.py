"""``python -m lifecycle serve``: the HTTP API and the console in one process.

Authentication is on unless ``--no-auth``, which only binds a loopback address
and says so on every start. Needs the ``api`` extra.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import redis

from lifecycle.cli.support import EXIT_OK, CliError, Context
from lifecycle.deployment import Deployment
from lifecycle.keys import Keys

__all__ = [
    "add_commands",
    "demo_tokens",
    "is_loopback",
    "load_tokens",
    "say_where",
    "serve_app",
    "server_arguments",
]

log = logging.getLogger(__name__)

EXAMPLES = """\
examples:
  python -m lifecycle serve --token-file /run/secrets/flowstream-tokens
  FLOWSTREAM_API_TOKENS=operate:$(openssl rand -hex 24) python -m lifecycle serve --port 9000
  python -m lifecycle serve --no-auth        # local development only: 127.0.0.1
token file: one token a line, read:TOKEN (GETs only) or operate:TOKEN (also starts
and actions), at least 16 characters; # comments.
"""

NO_AUTH_WARNING = (
    "WARNING: --no-auth: the API accepts every request without a token, including "
    "starts, terminations and deletes. Use it for local development only."
)


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "serve",
        parents=[common],
        help="the HTTP API and web console (the api extra)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    server_arguments(parser)
    parser.set_defaults(func=_serve, narrates=True)


def server_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``serve`` (``demo --serve`` takes them too)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="the API tokens (default: FLOWSTREAM_API_TOKENS), lines read:TOKEN / operate:TOKEN",
    )
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="accept requests without a token (loopback addresses only; development)",
    )
    parser.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="allow browser requests from this origin (repeatable; default: none)",
    )
    parser.add_argument(
        "--archive", metavar="DIR", help="receipts archive the history route reads from"
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_tokens(args: argparse.Namespace) -> Any:
    """The tokens ``args`` name (None with ``--no-auth``); refuses a start without any,
    and ``--no-auth`` on an address other hosts can reach."""
    from flowstream.api.auth import TOKENS_ENV, Tokens

    if args.no_auth:
        if not is_loopback(args.host):
            raise CliError(
                f"--no-auth with --host {args.host}: refused, every host that reaches it "
                "could act on every workflow; bind 127.0.0.1 or give tokens"
            )
        if args.token_file:
            raise CliError("--no-auth and --token-file: give one of them")
        print(NO_AUTH_WARNING, file=sys.stderr, flush=True)
        return None
    tokens = Tokens.load(args.token_file)
    if tokens is None:
        raise CliError(
            f"no API tokens: --token-file FILE or {TOKENS_ENV} (lines read:TOKEN or "
            "operate:TOKEN), or --no-auth for local development"
        )
    return tokens


def demo_tokens(args: argparse.Namespace) -> Any:
    """``demo --serve``'s tokens: as ``serve`` takes them, else one new operate token for
    this run (:func:`say_where` prints it: the demo's user logs in with it)."""
    require_extra()
    _check_port(args.port)
    if args.no_auth or args.token_file or os.environ.get("FLOWSTREAM_API_TOKENS"):
        return load_tokens(args)
    from flowstream.api.auth import Tokens

    return Tokens.parse(f"operate:{secrets.token_urlsafe(24)}", "demo")


def say_where(args: argparse.Namespace, tokens: Any, console: Any) -> None:
    """The console's address and, for a token made by :func:`demo_tokens`, the token."""
    host = f"[{args.host}]" if ":" in args.host else args.host
    console.print(f"console and API on http://{host}:{args.port}/ (Ctrl-C stops)", markup=False)
    if tokens is not None and not args.token_file and not os.environ.get("FLOWSTREAM_API_TOKENS"):
        token = tokens.entries[0][0].decode()
        console.print(f"log in with the operate token made for this run: {token}", markup=False)


def require_extra() -> None:
    """Refuse in one line when the ``api`` extra is not installed."""
    for module in ("fastapi", "uvicorn", "python_multipart"):
        try:
            __import__(module)
        except ImportError:
            raise CliError(
                f"the HTTP API needs the api extra ({module} is missing): "
                "pip install 'flowstream[api]'"
            ) from None


def _check_port(port: int) -> None:
    if not 0 <= port <= 65535:
        raise CliError(f"--port {port}: expected 0 to 65535")


def _serve(args: argparse.Namespace, context: Context) -> int:
    require_extra()
    _check_port(args.port)
    if "*" in args.cors_origin:
        # Credentialed requests from every origin: name the console's origins instead.
        raise CliError("--cors-origin '*': name each origin (scheme://host:port)")
    if args.archive is not None and not Path(args.archive).is_dir():
        raise CliError(f"--archive {args.archive}: no such directory")
    tokens = load_tokens(args)
    # Read (and checked against --partitions) now: a mismatch refuses the start in one
    # line rather than every request later.
    partitions = context.partitions
    if partitions.count > 1:
        log.info("serving %d partitions under %s", partitions.count, partitions.base)
    serve_app(context.client, context.keys, args, tokens, deployment=context.deployment)
    return EXIT_OK


def serve_app(
    client: redis.Redis,
    keys: Keys,
    args: argparse.Namespace,
    tokens: Any,
    deployment: Deployment | None = None,
    **uvicorn: Any,
) -> None:
    """Build the app and serve it until interrupted (SIGINT or SIGTERM). ``deployment``:
    its partitions and their clients (None: those stored under ``keys`` through
    ``client``)."""
    require_extra()
    import uvicorn as server  # the api extra, needed by this command only

    from flowstream.api.app import create_app
    from flowstream.api.context import ApiConfig

    config = ApiConfig(
        client,
        keys,
        tokens,
        tuple(args.cors_origin),
        archive=getattr(args, "archive", None),
        deployment=deployment,
    )
    app = create_app(config)
    log.info(
        "API on http://%s:%s (auth %s)",
        args.host,
        args.port,
        "off" if tokens is None else "on",
    )
    server.run(
        app,
        host=args.host,
        port=args.port,
        log_level="info",
        timeout_graceful_shutdown=3,
        **uvicorn,
    )
