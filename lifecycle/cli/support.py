"""What every ``python -m lifecycle`` command shares: exit codes, the Redis options,
reading flows and inputs, printing JSON, and the one mapping of errors to exit codes.

A command is a function ``(args, context) -> int`` set on its subparser with
``set_defaults(func=...)``; :func:`dispatch` runs it and turns every error family
into one line on stderr and an exit code, here and nowhere else.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis
from redis import exceptions as errors

from flowlang.compiler import compile_text
from flowlang.errors import FlowError
from flowlang.graph import Graph
from flowlang.limits import DEFAULT_LIMITS, loads_value
from lifecycle.deployment import Deployment
from lifecycle.errors import LifecycleError, NotAllowed
from lifecycle.keys import Keys
from lifecycle.partitions import CountWatch, Partitions
from rqse.cluster import Connections
from rqse.connection import RedisSettings, redis_arguments, resolve_url
from rqse.errors import RedisCommandError, RedisUnavailable, RqseError

__all__ = [
    "EXIT_ERROR",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliError",
    "Command",
    "Context",
    "Registrar",
    "at_least_one",
    "common_options",
    "partitions_argument",
    "watch_partition_count",
    "compile_file",
    "dispatch",
    "dumps_text",
    "print_json",
    "read_flow",
    "read_input",
]

log = logging.getLogger(__name__)

EXIT_OK = 0  # the command did what was asked (`run --wait`: the workflow finished)
# `run --wait`: the workflow failed or was terminated, or its start was refused;
# replay: a difference; a control: the workflow's state does not allow it, or not applied
EXIT_FAILED = 1
EXIT_USAGE = 2  # bad arguments, a bad flow or input, an unknown id, Redis unreachable
EXIT_ERROR = EXIT_USAGE  # the name the commands and their tests have always used

EXIT_CODES_HELP = """\
exit codes (run --help and the controls' --help say more):
  0  done (run --wait: the workflow finished)
  1  the command worked but the answer is no: run --wait: the workflow failed, was
     terminated, or its start was refused; replay: a difference; a control
     (terminate, pause, ...): the workflow's state does not allow it, or no lifecycle
     worker applied it in time; status: a warning
  2  error: bad arguments, a bad flow or input, an unknown workflow id, Redis unreachable
Redis: --redis-url or --redis-url-file, else REDIS_URL or REDIS_URL_FILE, else
REDIS_HOST/REDIS_PORT/REDIS_USERNAME/REDIS_PASSWORD.
"""


class CliError(LifecycleError):
    """Raised when a command-line value is bad (unreadable file, invalid JSON, ...):
    one line on stderr, exit 2."""


class Context:
    """What a command needs besides its arguments: the key layout, the deployment's
    partitions and, on first use, Redis clients checked with PING (commands that need no
    Redis never connect). With one partition (the default) :attr:`client` and
    :attr:`keys` are all there is; with several, :meth:`for_workflow` finds a workflow's
    and :meth:`each_partition` walks them all."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.keys = Keys(args.prefix)
        self._settings: RedisSettings | None = None
        self._deployment: Deployment | None = None

    @property
    def settings(self) -> RedisSettings:
        if self._settings is None:
            self._settings = resolve_url(self.args.redis_url, self.args.redis_url_file)
        return self._settings

    @property
    def where(self) -> str:
        """The Redis URL, password masked, and where it came from: for messages."""
        try:
            return f"{self.settings.masked_url} ({self.settings.origin})"
        except RqseError:
            return "the configured Redis"

    @property
    def deployment(self) -> Deployment:
        """The partitions and their clients; connecting on first use."""
        if self._deployment is None:
            cluster = True if getattr(self.args, "cluster", False) else None  # None: detect
            connections = Connections.open(self.settings, cluster=cluster)
            count = getattr(self.args, "partitions", None)
            self._deployment = Deployment(connections, self.args.prefix, count)
        return self._deployment

    @property
    def client(self) -> redis.Redis:
        """A client for the base prefix's keys: the only partition when there is one."""
        return self.deployment.client

    def client_for(self, keys: Keys) -> redis.Redis:
        """A client for the keys of one partition (checked with PING on first use)."""
        return self.deployment.client_for(keys)

    @property
    def partitions(self) -> Partitions:
        """The deployment's partitions: the stored count, checked against ``--partitions``."""
        return self.deployment.partitions

    def for_workflow(self, workflow_id: str) -> tuple[redis.Redis, Keys]:
        """The client and keys of the partition that holds ``workflow_id``."""
        return self.deployment.for_workflow(workflow_id)

    def for_tag(self, tag: str) -> tuple[redis.Redis, Keys]:
        """The client and keys of the partition of the runs tagged ``tag`` (a schedule)."""
        return self.deployment.for_tag(tag)

    def each_partition(self) -> list[tuple[redis.Redis, Keys]]:
        """Every partition's client and keys, by index."""
        return self.deployment.each_partition()

    def close(self) -> None:
        if self._deployment is not None:
            self._deployment.close()


Command = Callable[[argparse.Namespace, Context], int]

# Adds subcommands to a subparsers action, each with the common options as parent and
# ``set_defaults(func=<a Command>)``.
Registrar = Callable[[Any, argparse.ArgumentParser], None]


def at_least_one(text: str) -> int:
    """An argparse type for a count (of processes, entries, workflows): a whole number,
    1 or more (none would leave a run or a read waiting for ever)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def common_options() -> argparse.ArgumentParser:
    """The options every command takes (a parent parser): Redis, key prefix, verbosity."""
    common = argparse.ArgumentParser(add_help=False)
    redis_arguments(common)
    common.add_argument("--prefix", default="{flow}", help="key prefix (hash tag), default {flow}")
    partitions_argument(common)
    common.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    return common


def partitions_argument(parser: argparse.ArgumentParser) -> None:
    """``--partitions P``: the deployment's partition count, checked against the stored one."""
    parser.add_argument(
        "--partitions",
        type=int,
        metavar="P",
        help="partitions of the deployment (fixed when it is created by the first lifecycle "
        "worker; any other command checks it; default: the stored count, 1 when none)",
    )


def watch_partition_count(client: redis.Redis, partitions: Partitions) -> CountWatch | None:
    """When this process took the default of one partition because none was stored,
    stop it (as SIGTERM does) if a lifecycle worker stores another count meanwhile: the
    first worker of a new deployment may store P a moment after its peers started.
    ``watch.changed`` then says why; the process should exit 1 with it."""
    if partitions.stored:
        return None

    def stop(message: str) -> None:
        log.error("%s", message)
        os.kill(os.getpid(), signal.SIGTERM)

    return CountWatch(client, partitions.base, partitions.count, stop).start()


def dispatch(args: argparse.Namespace) -> int:
    """Run ``args.func``; every error becomes one line on stderr and its exit code."""
    context = Context(args)
    try:
        code: int = args.func(args, context)
        return code
    except KeyboardInterrupt:
        return EXIT_FAILED
    except BrokenPipeError:
        # The reader went away (`| head`): not an error of ours. Point stdout at
        # /dev/null so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except NotAllowed as error:  # the workflow exists; its state does not allow it
        print(f"error: {_one_line(str(error))}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as error:  # noqa: BLE001 - the one place errors meet the user
        log.debug("%s failed", args.command, exc_info=True)
        print(f"error: {_one_line(describe_error(error, context))}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        context.close()


def describe_error(error: BaseException, context: Context) -> str:
    """The line shown for ``error``: the message of our own errors, a plain account of
    Redis's, and the type and message of anything else (a bug, shown without traceback)."""
    if isinstance(error, (RedisUnavailable, RedisCommandError)) and isinstance(
        error.__cause__, redis.RedisError
    ):
        error = error.__cause__  # rqse's translation: describe what Redis said
    if isinstance(error, (FlowError, LifecycleError, RqseError)):
        return str(error)
    where = context.where
    if isinstance(error, (redis.AuthenticationError, errors.AuthorizationError)):
        return f"Redis at {where} refused the credentials: {error}"
    # redis-py takes the error code off the message and names the class after it.
    text = str(error)
    if isinstance(error, (errors.BusyLoadingError, errors.MasterDownError, errors.TryAgainError)):
        return f"Redis at {where} is not serving now (try again): {text}"
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError)):
        return f"cannot reach Redis at {where}: {text}"
    if isinstance(error, errors.OutOfMemoryError) or text.startswith("OOM"):
        return f"Redis at {where} is out of memory (maxmemory reached): {text}"
    if isinstance(error, errors.ReadOnlyError) or text.startswith("READONLY"):
        return f"Redis at {where} is read-only (a replica?): {text}"
    if isinstance(error, errors.NoPermissionError) or text.startswith(("NOPERM", "NOAUTH")):
        return f"Redis at {where} refused the command to this user: {text}"
    if isinstance(error, redis.RedisError):
        return f"Redis at {where} refused a command: {text}"
    if isinstance(error, OSError):
        name = f"{error.filename}: " if error.filename else ""
        return f"{name}{error.strerror or error}"
    return f"internal error, please report it: {type(error).__name__}: {error}"


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip()) or "(no message)"


def read_flow(file: str) -> tuple[str, str]:
    """(text, name for messages) of a flow file, '-' being stdin."""
    if file == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        return Path(file).read_text(encoding="utf-8"), file
    except OSError as error:
        raise CliError(f"cannot read {file}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise CliError(f"{file}: not UTF-8 text (byte at offset {error.start})") from None


def read_input(value: str | None) -> Any:
    """--input: JSON text, or @path to a JSON file. Too large or too deep is refused here,
    in one line, before anything is stored (lifecycle.submit checks the limits again)."""
    if value is None:
        return None
    where = "--input"
    if value.startswith("@"):
        where = value[1:]
        try:
            value = Path(where).read_text(encoding="utf-8")
        except OSError as error:
            raise CliError(f"cannot read {where}: {error.strerror}") from None
        except UnicodeDecodeError as error:
            raise CliError(f"{where}: not UTF-8 text (byte at offset {error.start})") from None
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError as error:
        if "depth limit" in str(error):  # orjson refuses past 1024 levels
            raise CliError(f"{where} nests deeper than {DEFAULT_LIMITS.depth} levels") from None
        raise CliError(f"{where}: invalid JSON: {error}") from None
    try:
        return loads_value(value, what=where)
    except FlowError as error:
        raise CliError(str(error)) from None


def compile_file(file: str) -> Graph:
    text, name = read_flow(file)
    return compile_text(text, name)


def dumps_text(value: Any, indent: bool = False) -> str:
    """JSON text of ``value`` that never fails: orjson, else the standard library (orjson
    stops at 254 levels of nesting), else the value's repr."""
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else 0).decode()
    except (TypeError, orjson.JSONEncodeError):
        pass
    try:
        return json.dumps(value, indent=2 if indent else None, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def print_json(value: Any) -> None:
    sys.stdout.write(dumps_text(value, indent=True) + "\n")
