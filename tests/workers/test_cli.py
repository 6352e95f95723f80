"""``python -m workers`` options that map to worker constructor keywords."""

from __future__ import annotations

from pathlib import Path

import redis

from tests.workers.helpers import KEYS
from workers.cli import _parser, resource_options
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


def test_the_resource_worker_is_built_with_the_base_dir_given(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    args = _parser().parse_args(["resource", "--base-dir", str(tmp_path)])
    pool = redis.ConnectionPool.from_url(redis_url)
    try:
        worker = build_listener(
            ResourceWorker, keys=KEYS, pool=pool, options=resource_options(args)
        )
        assert str(worker.base_dir) == str(tmp_path.resolve())  # type: ignore[attr-defined]
    finally:
        pool.disconnect()
