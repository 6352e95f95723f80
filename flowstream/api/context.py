"""What every route needs: the deployment's partitions and their clients, the
configuration, and who is asking.

Routes reach Redis through :class:`Place` objects: one per partition, found from a
workflow's id (:meth:`Api.for_workflow`), from a schedule's name (:meth:`Api.for_tag`),
or all of them (:meth:`Api.places`). With one partition (the default) there is one
place, the configured client under the configured prefix: the API as it always was.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import orjson
import redis
from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from flowlang.limits import DEFAULT_LIMITS, Limits, depth_within
from flowstream.api.auth import OPERATE, Tokens, role_of
from flowstream.api.problems import Problem
from lifecycle.client import Client
from lifecycle.deployment import Deployment
from lifecycle.engine.store import GraphCache
from lifecycle.keys import Keys
from lifecycle.partitions import Partitions

__all__ = [
    "Api",
    "ApiConfig",
    "Operator",
    "Place",
    "Reader",
    "Server",
    "in_thread",
    "json_body",
    "operator",
    "reader",
    "server",
]

CONSOLE_DIR = Path(__file__).resolve().parent.parent / "console"
BODY_SLACK = 64 * 1024  # bytes of a JSON body besides its flow text and input


@dataclass(frozen=True)
class ApiConfig:
    """How one API process runs. ``tokens`` None: no authentication (``--no-auth``).

    ``deployment``: the partitions and a client for each (``serve`` passes the CLI's);
    None: the partitions stored under ``keys``' prefix, every one reached through
    ``redis`` (one Redis server: the right client for every partition)."""

    redis: redis.Redis
    keys: Keys = field(default_factory=Keys)
    tokens: Tokens | None = None
    cors_origins: tuple[str, ...] = ()
    console_dir: Path | None = CONSOLE_DIR
    limits: Limits = DEFAULT_LIMITS
    max_streams: int = 64  # event streams open at once; more are refused with 503
    poll_s: float = 0.5  # how often an event stream reads Redis for a change
    archive: str | None = None  # receipts archive directory history reads (None: none)
    deployment: Deployment | None = None


class _OneClient:
    """The connections of a deployment on one Redis server: ``client`` for every key
    (what :class:`Deployment` asks of its connections)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def client_for(self, key: str) -> redis.Redis:
        return self.client

    def close(self) -> None:
        """The client is the caller's: it closes it."""


@dataclass(frozen=True)
class Place:
    """One partition as the routes reach it: its client, keys, the engine's client on
    them and the graphs read from them (graphs are stored per partition)."""

    redis: redis.Redis
    keys: Keys
    client: Client
    graphs: GraphCache


class SharedReads:
    """The last few values read for the event streams, by key (a workflow and its
    version): streams that follow one workflow read and encode each version once."""

    def __init__(self, size: int = 16) -> None:
        self._values: OrderedDict[Any, Any] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._values[key] = value
            while len(self._values) > self._size:
                self._values.popitem(last=False)


class Api:
    """The per-process state the routes share (``app.state.api``)."""

    def __init__(self, config: ApiConfig) -> None:
        self.config = config
        self.deployment = config.deployment or Deployment(
            _OneClient(config.redis),  # type: ignore[arg-type]  # duck-typed connections
            config.keys.prefix,
        )
        self._places: dict[str, Place] = {}
        self.metrics: Any = None  # /metrics' registry with several partitions (api.metrics)
        self._streams = 0
        self._lock = threading.Lock()
        self.shared = SharedReads()

    @property
    def partitions(self) -> Partitions:
        """The deployment's partitions (the stored count, read once)."""
        return self.deployment.partitions

    @property
    def several(self) -> bool:
        """Whether the deployment has more than one partition."""
        return self.partitions.count > 1

    def place(self, keys: Keys) -> Place:
        """The place of the partition under ``keys`` (made once, on first use)."""
        found = self._places.get(keys.prefix)
        if found is None:
            client = self.deployment.client_for(keys)
            graphs = GraphCache(client, keys, self.config.limits)
            found = Place(client, keys, Client(client, keys), graphs)
            with self._lock:
                found = self._places.setdefault(keys.prefix, found)
        return found

    @property
    def home(self) -> Place:
        """The place of the base prefix: the keys every partition shares (kind limits),
        and the only partition when there is one."""
        return self.place(self.deployment.home)

    def for_workflow(self, workflow_id: str) -> Place:
        """The place of the partition that holds ``workflow_id``."""
        return self.place(self.partitions.keys_for(workflow_id))

    def for_tag(self, tag: str) -> Place:
        """The place of the runs tagged ``tag``: a schedule's partition."""
        return self.place(self.partitions.keys(self.partitions.index_of_tag(tag)))

    def places(self) -> list[Place]:
        """Every partition's place, by index."""
        return [self.place(keys) for keys in self.partitions.all]

    @property
    def streams_full(self) -> bool:
        """Whether :attr:`ApiConfig.max_streams` event streams are open."""
        return self._streams >= self.config.max_streams

    def stream_opened(self) -> bool:
        """Take a place among the open streams; False when none is left."""
        with self._lock:
            if self._streams >= self.config.max_streams:
                return False
            self._streams += 1
            return True

    def stream_closed(self) -> None:
        with self._lock:
            self._streams -= 1


def server(request: Request) -> Api:
    """Dependency of the routes open to anyone (the login)."""
    api: Api = request.app.state.api
    return api


def reader(request: Request) -> Api:
    """Dependency of every route that reads: any valid token."""
    api: Api = request.app.state.api
    role_of(request, api.config.tokens)
    return api


def operator(request: Request) -> Api:
    """Dependency of every route that changes state: an operate token (403 for read)."""
    api: Api = request.app.state.api
    if role_of(request, api.config.tokens) != OPERATE:
        raise Problem(403, "this token may only read: actions need an operate token")
    return api


async def json_body(request: Request, api: Api) -> Any:
    """The request's JSON body, read up to the limits (413 past them, 400 for bad JSON,
    415 for another media type) without holding more than the limit in memory."""
    media = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if media != "application/json":
        raise Problem(415, f"Content-Type {media!r}: expected application/json")
    limit = api.config.limits.flow_bytes + api.config.limits.value_bytes + BODY_SLACK
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Problem(413, f"the body is {int(declared):,} bytes, more than the limit of {limit:,}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Problem(413, f"the body is more than the limit of {limit:,} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        if "depth limit" in str(error):
            raise Problem(400, "the body nests too deep") from None
        raise Problem(400, f"the body is not JSON: {error}") from None
    if not depth_within(value, api.config.limits.depth + 1):  # +1: the body's own object
        raise Problem(400, f"the body nests deeper than {api.config.limits.depth} levels")
    return value


async def in_thread(function: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a blocking call (Redis) off the event loop."""
    return await run_in_threadpool(function, *args, **kwargs)


Reader = Annotated[Api, Depends(reader)]
Operator = Annotated[Api, Depends(operator)]
Server = Annotated[Api, Depends(server)]
