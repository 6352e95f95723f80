"""The console on a deployment of three partitions: the list shows every partition's
workflows, a workflow's page reads its partition, the status page shows every
partition's streams (``python -m lifecycle serve`` and workers on the test Redis)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from lifecycle.keys import Keys
from lifecycle.partitions import Partitions
from tests.conftest import wait_until
from tests.console.test_console import Console, _answers, _free_port, log_in
from tests.processes import Processes

OPERATE = "operate-token-for-console-tests"
PARTITIONS = Partitions("{flow}", 3)


@pytest.fixture
def partitioned(
    redis_client: redis.Redis, processes: Processes, tmp_path: Path
) -> Iterator[Console]:
    processes.start("lifecycle", "worker", "--partitions", "3", "--consumer", "lc")
    wait_until(lambda: redis_client.get(Keys().partitions), 20, "the partition count stored")
    processes.start("workers", "noop", "--kinds", "default", "--consumer", "noop")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"operate:{OPERATE}\n")
    port = _free_port()
    server = processes.start(
        "lifecycle", "serve", "--port", str(port), "--token-file", str(tokens), stderr=True
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _answers(url) or server.poll() is not None, timeout=30, what="the API")
    if server.poll() is not None:
        assert server.stderr is not None
        pytest.fail(f"serve exited: {server.stderr.read().decode()[-2000:]}")
    yield Console(url, processes, redis_client)


def test_the_list_workflow_and_status_pages_show_every_partition(
    page: Any, partitioned: Console
) -> None:
    http = httpx.Client(base_url=partitioned.url, headers={"Authorization": f"Bearer {OPERATE}"})
    ids = [partitioned.start("A → B") for _ in range(3)]
    while len({PARTITIONS.index_of(i) for i in ids}) < 2:  # ids are random
        ids.append(partitioned.start("A → B"))
    wait_until(
        lambda: all(http.get(f"/api/workflows/{i}").json()["state"] == "finished" for i in ids),
        what="every workflow finished",
    )
    log_in(page, partitioned)
    page.wait_for_function(
        f"document.querySelectorAll('#list-table tbody tr').length === {len(ids)}"
    )
    for workflow_id in ids:
        assert page.locator(f'#list-table tbody tr:has-text("{workflow_id}")').count() == 1
    far = next(i for i in ids if PARTITIONS.index_of(i) > 0)  # not the base prefix's
    page.goto(f"{partitioned.url}/#/workflows/{far}")
    page.wait_for_url(re.compile(r"#/workflows/.+"))
    page.wait_for_selector("#wf-facts [data-state=finished]")
    page.wait_for_selector('#graph .node[data-label="B"].st-ended')
    page.click("nav a[data-page=status]")
    for keys in PARTITIONS.all:
        page.wait_for_selector(f'#status-streams td:text-is("{keys.lifecycle}")')
    assert page.errors == []
    http.close()
