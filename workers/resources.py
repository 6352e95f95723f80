"""URI sources and sinks (kind ``resource``): ``ResourceWorker``; local files, http(s), JSON, YAML.

A source (``<orders.json> → A``) loads its URI and outputs the data; a sink
(``A → <out.json>``) stores its input there and outputs that input. The
start-task's ``name`` is the URI; whether the node is a source or a sink is
read from the workflow's stored graph (the event does not say).

* Local paths (``data/in.json``, ``file:data/in.json``) resolve against the
  worker's base directory — the flow file's directory is not in the event, so
  run the worker there or pass ``--base-dir``. A path that leaves the base
  directory (``../x``, an absolute path elsewhere, a symlink out) is refused.
* ``http://`` and ``https://``: GET for a source, PUT for a sink (parameter
  ``method`` may say POST), with ``timeout`` seconds (default 10) and optional
  ``headers``. Standard library only (urllib).
* Format: parameter ``format`` (``json``/``yaml``), else the Content-Type
  (http), else the extension (``.json``, ``.yaml``, ``.yml``); JSON is tried
  last. YAML is read with ``yaml.safe_load`` only.
"""

from __future__ import annotations

import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import yaml

from lifecycle.keys import RESOURCE_KIND, Keys
from lifecycle.store import GraphCache
from workers.errors import ResourceError
from workers.task import Task, TaskListener

__all__ = ["ResourceWorker", "load_resource", "store_resource"]

DEFAULT_TIMEOUT = 10.0
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


def _decode(uri: str, data: bytes, fmt: str | None) -> Any:
    try:
        if fmt == "yaml":
            return yaml.safe_load(data)
        return orjson.loads(data)
    except (yaml.YAMLError, orjson.JSONDecodeError) as error:
        expected = "YAML" if fmt == "yaml" else "JSON"
        raise ResourceError(f"{uri}: not valid {expected}: {error}") from error


def _encode(uri: str, value: Any, fmt: str | None) -> tuple[bytes, str]:
    """Body and content type of ``value``."""
    if fmt == "yaml":
        text = yaml.safe_dump(value, sort_keys=False, allow_unicode=True)
        return text.encode(), "application/yaml"
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2), "application/json"
    except TypeError as error:
        raise ResourceError(f"{uri}: cannot write as JSON: {error}") from error


def _is_http(uri: str) -> bool:
    return urllib.parse.urlsplit(uri).scheme.lower() in ("http", "https")


def local_path(uri: str, base_dir: str | os.PathLike[str]) -> Path:
    """The file ``uri`` names under ``base_dir``; raises ResourceError if it leaves it."""
    parts = urllib.parse.urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "file":
        raw = urllib.parse.unquote(parts.path)
    elif scheme and len(scheme) > 1:  # one letter: a Windows drive, not a scheme
        raise ResourceError(
            f"{uri}: unsupported URI scheme {scheme!r} (expected a path, file:, http: or https:)"
        )
    else:
        raw = uri
    base = Path(base_dir).resolve()
    path = (base / raw).resolve()  # resolves '..' and symlinks before the check
    if not path.is_relative_to(base):
        raise ResourceError(f"{uri}: resolves to {path}, outside the base directory {base}")
    return path


def load_resource(
    uri: str, params: Mapping[str, Any] | None = None, base_dir: str | os.PathLike[str] = "."
) -> Any:
    """The data at ``uri`` (a source)."""
    params = params or {}
    if _is_http(uri):
        body, content_type = _http(uri, params, str(params.get("method", "GET")).upper(), None)
        return _decode(uri, body, _format(uri, params, content_type))
    path = local_path(uri, base_dir)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ResourceError(f"{uri}: cannot read {path}: {error.strerror}") from error
    return _decode(uri, data, _format(uri, params))


def store_resource(
    uri: str,
    value: Any,
    params: Mapping[str, Any] | None = None,
    base_dir: str | os.PathLike[str] = ".",
) -> None:
    """Write ``value`` to ``uri`` (a sink): a file replaced atomically, or an HTTP PUT."""
    params = params or {}
    fmt = _format(uri, params)
    body, content_type = _encode(uri, value, fmt)
    if _is_http(uri):
        _http(uri, params, str(params.get("method", "PUT")).upper(), (body, content_type))
        return
    path = local_path(uri, base_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write beside, then rename: a reader never sees half a file.
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(handle, "wb") as file:
            file.write(body)
        os.replace(temporary, path)
    except OSError as error:
        raise ResourceError(f"{uri}: cannot write {path}: {error.strerror}") from error


def _http(
    uri: str, params: Mapping[str, Any], method: str, payload: tuple[bytes, str] | None
) -> tuple[bytes, str | None]:
    """(body, content type) of one request; raises ResourceError on any failure."""
    if method not in ("GET", "PUT", "POST", "PATCH"):
        raise ResourceError(f"{uri}: method {method!r}, expected GET, PUT, POST or PATCH")
    timeout = params.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ResourceError(f"{uri}: timeout {timeout!r}, expected a positive number of seconds")
    headers = {str(k): str(v) for k, v in (params.get("headers") or {}).items()}
    data = None
    if payload is not None:
        data, headers["Content-Type"] = payload[0], headers.get("Content-Type", payload[1])
    request = urllib.request.Request(uri, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=float(timeout)) as response:  # noqa: S310
            return response.read(), response.headers.get("Content-Type")
    except urllib.error.HTTPError as error:
        raise ResourceError(f"{uri}: {method} answered {error.code} {error.reason}") from error
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ResourceError(f"{uri}: {method} failed: {reason}") from error


class ResourceWorker(TaskListener):
    """Loads sources and stores sinks named by URI (see the module docstring).

    ``base_dir``: where relative paths resolve (default: the current directory);
    nothing outside it is read or written.
    """

    kind = RESOURCE_KIND

    def __init__(
        self,
        kind: str | None = None,
        keys: Keys | None = None,
        *,
        base_dir: str | os.PathLike[str] = ".",
        **options: Any,
    ) -> None:
        super().__init__(kind, keys, **options)
        self.base_dir = os.path.abspath(base_dir)
        self.graphs = GraphCache(self.connection, self.keys)

    def node_kind(self, task: Task) -> str:
        """``source`` or ``sink``: from the workflow's graph (cached per graph hash)."""
        digest = self.connection.hget(self.keys.workflow(task.workflow), "g")
        if digest is None or task.index is None:
            raise ResourceError(f"{task.name}: workflow {task.workflow} or its node is unknown")
        node = self.graphs.machine(digest.decode()).graph.nodes[task.index]
        return str(node.kind)

    def run(self, task: Task) -> Any:
        if self.node_kind(task) == "sink":
            store_resource(task.name, task.input, task.parameters, self.base_dir)
            return task.input
        return load_resource(task.name, task.parameters, self.base_dir)
