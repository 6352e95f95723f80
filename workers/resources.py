"""URI sources and sinks (kind ``resource``): ``ResourceWorker``; local files, http(s), JSON, YAML.

A source (``<orders.json> → A``) loads its URI and outputs the data; a sink
(``A → <out.json>``) stores its input there and outputs that input. The
start-task's ``name`` is the URI and its ``role`` (``source`` or ``sink``) says
which of the two the node is; a start-task without a role fails.

* Local paths (``data/in.json``, ``file:data/in.json``) stay under the worker's
  root, ``base_dir`` (default ``$XDG_DATA_HOME/flowstream/resources``):
  ``..`` and absolute paths elsewhere are refused, sinks write no code or hidden
  files and follow no symlinks (:mod:`workers.resource_files`).
* ``http://`` and ``https://``: GET for a source, PUT for a sink (parameter
  ``method`` may say POST or PATCH), optional ``headers``, and ``timeout``: the
  total seconds for the request (at most the worker's ``http_deadline``). Only
  public addresses unless inside ``allow_networks``; redirects, body size and
  time are bounded (:mod:`workers.resource_http`).
* Format: parameter ``format`` (``json``/``yaml``), else the Content-Type
  (http), else the extension (``.json``, ``.yaml``, ``.yml``); JSON is tried
  last. JSON is decoded within :class:`flowlang.limits.Limits` (size, depth),
  YAML with :func:`flowlang.literals.safe_yaml` (alias bombs refused).
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml

from flowlang.limits import DEFAULT_LIMITS, LimitExceeded, Limits, depth_within, loads_value
from flowlang.literals import safe_yaml
from lifecycle.events import ROLES
from lifecycle.keys import RESOURCE_KIND, Keys
from rqse.connection import mask_url
from workers.errors import ResourceError
from workers.resource_files import default_base_dir, read_file, write_file
from workers.resource_http import Network, parse_networks, request
from workers.task import Task, TaskListener

__all__ = [
    "DEFAULT_HTTP_DEADLINE",
    "ResourceTask",
    "ResourceWorker",
    "Resources",
    "load_resource",
    "store_resource",
]

DEFAULT_HTTP_DEADLINE = 30.0  # seconds for one request: resolution, redirects and body
_YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")


def _format(uri: str, params: Mapping[str, Any], content_type: str | None = None) -> str | None:
    """``json``, ``yaml`` or None (unknown: try JSON)."""
    given = params.get("format")
    if given is not None:
        if given not in ("json", "yaml"):
            raise ResourceError(f"{uri}: format {given!r}, expected 'json' or 'yaml'")
        return str(given)
    if content_type:
        media = content_type.split(";")[0].strip().lower()
        if media == "application/json" or media.endswith("+json"):
            return "json"
        if media in _YAML_TYPES or media.endswith("+yaml"):
            return "yaml"
    suffix = Path(urllib.parse.urlsplit(uri).path).suffix.lower()
    return {".json": "json", ".yaml": "yaml", ".yml": "yaml"}.get(suffix)


def _decode(uri: str, data: bytes, fmt: str | None, limits: Limits) -> Any:
    where = mask_url(uri)
    if fmt != "yaml":
        try:
            return loads_value(data, limits, what=where)
        except LimitExceeded as error:
            raise ResourceError(str(error)) from None
    try:
        value = safe_yaml(data, limits)
    except LimitExceeded as error:
        raise ResourceError(f"{where}: not valid YAML: {error}") from None
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ResourceError(f"{where}: not valid YAML{at}: {problem}") from None
    if not depth_within(value, limits.depth):
        raise ResourceError(f"{where}: nests deeper than {limits.depth} levels")
    try:  # YAML extras (dates, integer keys) as JSON carries them
        return orjson.loads(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS))
    except (TypeError, orjson.JSONEncodeError) as error:
        raise ResourceError(f"{where}: YAML value not representable as JSON: {error}") from None


def _encode(uri: str, value: Any, fmt: str | None) -> tuple[bytes, str]:
    """Body and content type of ``value``."""
    if fmt == "yaml":
        text = yaml.safe_dump(value, sort_keys=False, allow_unicode=True)
        return text.encode(), "application/yaml"
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2), "application/json"
    except TypeError as error:
        raise ResourceError(f"{mask_url(uri)}: cannot write as JSON: {error}") from error


def _is_http(uri: str) -> bool:
    return urllib.parse.urlsplit(uri).scheme.lower() in ("http", "https")


@dataclasses.dataclass(frozen=True, slots=True)
class Resources:
    """Where resource tasks may read and write: one root for files, the networks HTTP
    may reach besides public addresses, and the bounds on what comes back."""

    base_dir: Path
    allow_networks: tuple[Network, ...] = ()
    limits: Limits = DEFAULT_LIMITS
    http_deadline: float = DEFAULT_HTTP_DEADLINE

    @classmethod
    def configure(
        cls,
        base_dir: str | os.PathLike[str] | None = None,
        allow_networks: Sequence[str] = (),
        limits: Limits = DEFAULT_LIMITS,
        http_deadline: float = DEFAULT_HTTP_DEADLINE,
    ) -> Resources:
        """From plain settings: ``base_dir`` None means :func:`default_base_dir`;
        ``allow_networks`` are CIDR strings (ValueError naming a bad one)."""
        if isinstance(allow_networks, str):  # one CIDR passed bare would split into chars
            allow_networks = [allow_networks]
        if http_deadline <= 0:
            raise ValueError(f"http_deadline {http_deadline!r}: expected a positive number")
        root = Path(base_dir) if base_dir is not None else default_base_dir()
        return cls(
            root.expanduser().resolve(), parse_networks(allow_networks), limits, http_deadline
        )

    def _deadline(self, uri: str, params: Mapping[str, Any]) -> float:
        timeout = params.get("timeout", self.http_deadline)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ResourceError(
                f"{mask_url(uri)}: timeout {timeout!r}, expected a positive number of seconds"
            )
        return min(float(timeout), self.http_deadline)

    def _http(
        self, uri: str, params: Mapping[str, Any], default: str, body: tuple[bytes, str] | None
    ) -> tuple[bytes, str | None]:
        method = str(params.get("method", default)).upper()
        allowed = ("GET",) if body is None else ("PUT", "POST", "PATCH")
        if method not in allowed:
            raise ResourceError(
                f"{mask_url(uri)}: method {method!r}, expected {' or '.join(allowed)}"
            )
        given = params.get("headers") or {}
        if not isinstance(given, Mapping):
            raise ResourceError(f"{mask_url(uri)}: headers {given!r}, expected an object")
        headers = {str(k): str(v) for k, v in given.items()}
        data = None
        if body is not None:
            data = body[0]
            headers.setdefault("Content-Type", body[1])
        response = request(
            uri,
            method,
            body=data,
            headers=headers,
            allow_networks=self.allow_networks,
            limit=self.limits.value_bytes,
            deadline=self._deadline(uri, params),
        )
        return response.body, response.content_type

    def load(self, uri: str, params: Mapping[str, Any] | None = None) -> Any:
        """The data at ``uri`` (a source)."""
        params = params or {}
        fmt = _format(uri, params)  # a bad `format` fails before anything is fetched
        if _is_http(uri):
            data, content_type = self._http(uri, params, "GET", None)
            return _decode(uri, data, _format(uri, params, content_type), self.limits)
        return _decode(
            uri, read_file(uri, self.base_dir, self.limits.value_bytes), fmt, self.limits
        )

    def store(self, uri: str, value: Any, params: Mapping[str, Any] | None = None) -> None:
        """Write ``value`` to ``uri`` (a sink): a file replaced atomically, or an HTTP PUT."""
        params = params or {}
        body = _encode(uri, value, _format(uri, params))
        if _is_http(uri):
            self._http(uri, params, "PUT", body)
        else:
            write_file(uri, self.base_dir, body[0])


def load_resource(
    uri: str,
    params: Mapping[str, Any] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    allow_networks: Sequence[str] = (),
) -> Any:
    """The data at ``uri`` (a source); see :class:`Resources` for the arguments."""
    return Resources.configure(base_dir, allow_networks).load(uri, params)


def store_resource(
    uri: str,
    value: Any,
    params: Mapping[str, Any] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    allow_networks: Sequence[str] = (),
) -> None:
    """Write ``value`` to ``uri`` (a sink); see :class:`Resources` for the arguments."""
    Resources.configure(base_dir, allow_networks).store(uri, value, params)


@dataclasses.dataclass(frozen=True, slots=True)
class ResourceTask(Task):
    """A resource task: a :class:`Task` and the node's ``role`` from its start-task
    (``source``, ``sink``, or None when the engine did not say)."""

    role: str | None = None


class ResourceWorker(TaskListener):
    """Loads sources and stores sinks named by URI (see the module docstring).

    ``base_dir``: the root of local files (None: :func:`default_base_dir`); nothing
    outside it is read or written. ``allow_networks``: CIDRs HTTP may reach beyond
    public addresses (e.g. ``["10.1.0.0/16"]`` for an internal service).
    ``limits.value_bytes`` caps what a source reads; ``http_deadline`` bounds one
    request in seconds. Bad settings raise ValueError naming the value.
    """

    kind = RESOURCE_KIND

    def __init__(
        self,
        kind: str | None = None,
        keys: Keys | None = None,
        *,
        base_dir: str | os.PathLike[str] | None = None,
        allow_networks: Sequence[str] = (),
        limits: Limits = DEFAULT_LIMITS,
        http_deadline: float = DEFAULT_HTTP_DEADLINE,
        **options: Any,
    ) -> None:
        self.resources = Resources.configure(base_dir, allow_networks, limits, http_deadline)
        super().__init__(kind, keys, **options)

    @property
    def base_dir(self) -> Path:
        return self.resources.base_dir

    def task(self, event_id: str, event: Mapping[str, Any]) -> ResourceTask:
        base = super().task(event_id, event)
        values = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        role = event.get("role")
        return ResourceTask(**values, role=None if role is None else str(role))

    def run(self, task: Task) -> Any:
        role = task.role if isinstance(task, ResourceTask) else None
        if role not in ROLES:
            if role is None:
                raise ResourceError(
                    f"{mask_url(task.name)}: start-task has no role (expected 'source' or 'sink')"
                )
            raise ResourceError(
                f"{mask_url(task.name)}: role {role!r}, expected 'source' or 'sink'"
            )
        if role == "sink":
            self.resources.store(task.name, task.input, task.parameters)
            return task.input
        return self.resources.load(task.name, task.parameters)
