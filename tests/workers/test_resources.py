"""URI sources and sinks: local files under a base directory, http(s) on 127.0.0.1."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis
import yaml

from tests.workers.helpers import Threads, submit, wait_for_end
from workers.errors import ResourceError
from workers.noop import NoopWorker
from workers.resources import ResourceWorker, load_resource, store_resource


class Handler(http.server.BaseHTTPRequestHandler):
    stored: dict[str, tuple[bytes, str]] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/missing":
            self.send_error(404, "Not Found")
            return
        body, kind = {
            "/data": (b'{"rows": [1, 2]}', "application/json; charset=utf-8"),
            "/config": (b"name: x\nlist: [1, 2]\n", "application/yaml"),
        }.get(self.path, self.stored.get(self.path, (b"{}", "application/json")))
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the client gave up (the timeout test)
            self.wfile.write(body)

    def do_PUT(self) -> None:  # noqa: N802
        length = int(self.headers["Content-Length"])
        self.stored[self.path] = (self.rfile.read(length), self.headers["Content-Type"])
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_local_json_and_yaml_files_load_and_store_under_the_base_directory(
    tmp_path: Path,
) -> None:
    (tmp_path / "in.json").write_text('{"a": [1, 2]}')
    (tmp_path / "in.yml").write_text("a: [1, 2]\n")
    assert load_resource("in.json", {}, tmp_path) == {"a": [1, 2]}
    assert load_resource("file:in.yml", {}, tmp_path) == {"a": [1, 2]}
    store_resource("out/deep/result.yaml", {"b": "é"}, {}, tmp_path)
    assert yaml.safe_load((tmp_path / "out/deep/result.yaml").read_text()) == {"b": "é"}
    store_resource("plain.txt", [1], {"format": "json"}, tmp_path)
    assert orjson.loads((tmp_path / "plain.txt").read_bytes()) == [1]


@pytest.mark.parametrize(
    "uri", ["../escape.json", "/etc/passwd", "file:///etc/passwd", "a/../../x"]
)
def test_a_path_leaving_the_base_directory_is_refused(tmp_path: Path, uri: str) -> None:
    with pytest.raises(ResourceError, match="outside the base directory"):
        load_resource(uri, {}, tmp_path / "base")


def test_a_symlink_out_of_the_base_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "secret.json").write_text("{}")
    (tmp_path / "base" / "link.json").symlink_to(tmp_path / "secret.json")
    with pytest.raises(ResourceError, match="outside the base directory"):
        load_resource("link.json", {}, tmp_path / "base")


def test_unsafe_yaml_and_unknown_schemes_are_refused(tmp_path: Path) -> None:
    (tmp_path / "evil.yaml").write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(ResourceError, match="not valid YAML"):
        load_resource("evil.yaml", {}, tmp_path)
    with pytest.raises(ResourceError, match="unsupported URI scheme 'ftp'"):
        load_resource("ftp://host/x.json", {}, tmp_path)


def test_http_sources_read_json_or_yaml_by_content_type_and_sinks_put(server: str) -> None:
    assert load_resource(f"{server}/data") == {"rows": [1, 2]}
    assert load_resource(f"{server}/config") == {"name": "x", "list": [1, 2]}
    store_resource(f"{server}/put.yaml", {"k": 1})
    body, kind = Handler.stored["/put.yaml"]
    assert kind == "application/yaml" and yaml.safe_load(body) == {"k": 1}


def test_http_errors_and_timeouts_are_resource_errors(server: str) -> None:
    with pytest.raises(ResourceError, match="GET answered 404"):
        load_resource(f"{server}/missing")
    started = time.monotonic()
    with pytest.raises(ResourceError, match="GET failed"):
        load_resource(f"{server}/slow", {"timeout": 0.2})
    assert time.monotonic() - started < 0.9


def test_a_flow_with_a_file_source_and_an_http_sink_runs_end_to_end(
    redis_client: redis.Redis, threads: Threads, tmp_path: Path, server: str
) -> None:
    (tmp_path / "orders.json").write_text('[{"id": 1}, {"id": 2}]')
    threads.lifecycle()
    options = {"pool": threads.pool, "handle_signals": False, "block_ms": 100}
    threads.start(ResourceWorker(base_dir=tmp_path, **options))
    threads.start(NoopWorker(["default"], **options))
    flow = f"<orders.json> → * check → <{server}/result.json>"
    final = wait_for_end(redis_client, submit(redis_client, flow))
    assert final == {"status": "finished", "output": [{"id": 1}, {"id": 2}]}
    wait_for_end(redis_client, submit(redis_client, "<orders.json> → <copy.json>"))
    assert orjson.loads(Handler.stored["/result.json"][0]) == [{"id": 1}, {"id": 2}]
    assert orjson.loads((tmp_path / "copy.json").read_bytes()) == [{"id": 1}, {"id": 2}]


def test_a_missing_source_file_fails_the_workflow_with_the_path(
    redis_client: redis.Redis, threads: Threads, tmp_path: Path
) -> None:
    threads.lifecycle()
    options = {"pool": threads.pool, "handle_signals": False, "block_ms": 100}
    threads.start(ResourceWorker(base_dir=tmp_path, **options))
    final = wait_for_end(redis_client, submit(redis_client, "<nothing.json> → <out.json>"))
    assert final["status"] == "failed"
    assert "ResourceError: nothing.json: cannot read" in final["error"]
