"""``python -m lifecycle``: the worker, and the commands to run and look at workflows."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import orjson
import redis

from flowlang.compiler import compile_text
from flowlang.errors import FlowError
from lifecycle.errors import LifecycleError
from lifecycle.keys import Keys
from rqse.connection import RedisSettings
from rqse.errors import RqseError

__all__ = ["main"]

EXIT_OK = 0  # the command worked; `run --wait`: the workflow finished
EXIT_FAILED = 1  # `run --wait`: the workflow failed or was terminated
EXIT_ERROR = 2  # bad arguments, a bad flow, an unknown id, Redis unreachable

EPILOG = """\
examples:
  python -m lifecycle worker                          # run a lifecycle worker
  python -m lifecycle run examples/orders.flow --wait # start a workflow, wait for its output
  python -m lifecycle demo                            # everything in one process, embedded Redis

exit codes: 0 ok (workflow finished), 1 workflow failed or terminated,
2 error (bad flow, unknown workflow, Redis unreachable)
Redis: --redis-url, else REDIS_URL, else REDIS_HOST/REDIS_PORT/REDIS_USERNAME/REDIS_PASSWORD.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lifecycle",
        description="Run workflows on Redis Streams.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--redis-url", help="redis://, rediss:// or unix:// URL")
    common.add_argument("--prefix", default="{flow}", help="key prefix (hash tag), default {flow}")
    common.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    worker = commands.add_parser("worker", parents=[common], help="run a lifecycle worker")
    worker.add_argument("--consumer", help="stable consumer name (default: host-pid-random)")
    worker.add_argument("--no-timers", action="store_true", help="do not fire retry/timeout timers")
    worker.add_argument(
        "--no-wait",
        action="store_true",
        help="do not serve the built-in wait: tasks (run python -m workers wait elsewhere)",
    )
    worker.add_argument(
        "--claim-idle",
        type=float,
        default=10.0,
        help="seconds before taking over a dead worker's events (default 10)",
    )
    worker.add_argument("--batch-size", type=int, default=200, help="events per read (default 200)")
    worker.add_argument(
        "--accept-untokened-answers",
        action="store_true",
        help="take end-tasks that carry no attempt token (task workers written for the "
        "predecessor system); a wrong token is refused all the same",
    )

    run = commands.add_parser("run", parents=[common], help="start a workflow from a .flow file")
    run.add_argument("file", help="the .flow file ('-' for stdin)")
    run.add_argument("--input", help="workflow input: JSON text, or @file.json")
    run.add_argument("--id", help="workflow id (default: <flow name>-<uuid>)")
    run.add_argument("--wait", action="store_true", help="wait for the end, print the output")
    run.add_argument("--timeout", type=float, help="with --wait: give up after this many seconds")

    inspect = commands.add_parser("inspect", parents=[common], help="show one workflow")
    inspect.add_argument("id")
    inspect.add_argument("--json", action="store_true", help="print JSON")

    listing = commands.add_parser("list", parents=[common], help="one line per workflow")
    listing.add_argument("--state", help="only workflows in this state (running, finished, ...)")
    listing.add_argument("--flow", help="only workflows of this flow name")
    listing.add_argument("--json", action="store_true", help="print JSON")

    demo = commands.add_parser(
        "demo", parents=[common], help="embedded Redis + workers: run a flow end to end"
    )
    demo.add_argument("file", nargs="?", help="the .flow file (default: a built-in example)")
    demo.add_argument("--input", help="workflow input: JSON text, or @file.json")
    demo.add_argument("--delay-max", type=float, default=0.3, help="simulated task time, max s")
    from lifecycle.audit_cli import add_commands

    add_commands(commands, common)  # receipts, replay, history
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    quiet = args.command != "worker" and not args.verbose  # only the worker narrates
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    keys = Keys(args.prefix)
    from lifecycle.audit_cli import run_command

    code = run_command(args, keys)
    if code is not None:
        return code
    try:
        if args.command == "demo":
            from lifecycle.demo import demo

            return demo(args, keys)
        client = connect(args.redis_url)
        if args.command == "worker":
            return _worker(args, client, keys)
        if args.command == "run":
            from lifecycle.commands import run

            return run(args, client, keys)
        from lifecycle.commands import inspect, list_command

        return (
            inspect(args, client, keys)
            if args.command == "inspect"
            else list_command(args, client, keys)
        )
    except (FlowError, LifecycleError, RqseError, CliError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except redis.ConnectionError as error:
        print(f"error: cannot reach Redis: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_FAILED


class CliError(Exception):
    """A bad command-line value: one line on stderr, exit 2."""


def connect(url: str | None) -> redis.Redis:
    """A client from --redis-url or the environment, checked with PING."""
    settings = RedisSettings.resolve(url=url)
    client = redis.Redis(connection_pool=settings.pool())
    try:
        client.ping()
    except redis.RedisError as error:
        raise CliError(
            f"cannot reach Redis at {settings.masked_url} ({settings.origin}): {error}"
        ) from None
    return client


def read_flow(file: str) -> tuple[str, str]:
    """(text, name for messages) of a flow file, '-' being stdin."""
    if file == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        return Path(file).read_text(encoding="utf-8"), file
    except OSError as error:
        raise CliError(f"cannot read {file}: {error.strerror}") from None


def read_input(value: str | None) -> Any:
    """--input: JSON text, or @path to a JSON file."""
    if value is None:
        return None
    where = "--input"
    if value.startswith("@"):
        where = value[1:]
        try:
            value = Path(where).read_text(encoding="utf-8")
        except OSError as error:
            raise CliError(f"cannot read {where}: {error.strerror}") from None
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as error:
        raise CliError(f"{where}: invalid JSON: {error}") from None


def compile_file(file: str) -> Any:
    text, name = read_flow(file)
    return compile_text(text, name)


def _worker(args: argparse.Namespace, client: redis.Redis, keys: Keys) -> int:
    from lifecycle.worker import LifecycleWorker
    from rqse.process import settle_process

    worker = LifecycleWorker(
        keys,
        timers=not args.no_timers,
        untokened_answers=args.accept_untokened_answers,
        consumer=args.consumer,
        pool=client.connection_pool,
        claim_idle=args.claim_idle,
        batch_size=args.batch_size,
    )
    logging.getLogger(__name__).info(
        "lifecycle worker %s listening on %s", worker.consumer, keys.lifecycle
    )
    wait = None
    if not args.no_wait:
        # The built-in wait: kind runs beside the lifecycle by default (issue 6); its
        # state lives in Redis, so stopping this thread loses no registered wait.
        from workers.wait import WaitWorker

        wait = WaitWorker(
            keys,
            pool=client.connection_pool,
            consumer=args.consumer,
            claim_idle=args.claim_idle,
            handle_signals=False,
        )
        wait.start()
    settle_process()
    try:
        worker.listen()
    finally:
        if wait is not None:
            wait.stop()
            wait.join(10)
    return EXIT_OK
