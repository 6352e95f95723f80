"""``python -m workers`` options that map to worker constructor keywords."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.workers.helpers import KEYS
from workers.cli import _parser, main, resource_options
from workers.resources import ResourceWorker
from workers.runner import build_listener


def test_resource_options_are_passed_only_when_given() -> None:
    args = _parser().parse_args(["resource"])
    assert resource_options(args) == {}


def test_base_dir_is_a_path_and_allow_network_repeats_into_a_list() -> None:
    args = _parser().parse_args(
        ["resource", "--base-dir", "flows", "--allow-network", "10.0.0.0/8"]
        + ["--allow-network", "192.168.1.0/24"]
    )
    assert resource_options(args) == {
        "base_dir": Path("flows"),
        "allow_networks": ["10.0.0.0/8", "192.168.1.0/24"],
    }


def test_the_resource_worker_is_built_with_the_base_dir_and_networks_given(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    argv = ["resource", "--base-dir", str(tmp_path), "--allow-network", "10.0.0.0/8"]
    args = _parser().parse_args(argv)
    pool = redis.ConnectionPool.from_url(redis_url)
    try:
        worker = build_listener(
            ResourceWorker, keys=KEYS, pool=pool, options=resource_options(args)
        )
        assert isinstance(worker, ResourceWorker)
        assert worker.base_dir == tmp_path.resolve()
        assert [str(n) for n in worker.resources.allow_networks] == ["10.0.0.0/8"]
    finally:
        pool.disconnect()


def test_a_bad_network_is_refused_in_one_line_with_exit_2(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["resource", "--redis-url", redis_url, "--allow-network", "10.0.0.0/99"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "10.0.0.0/99" in err and len(err.splitlines()) == 1
