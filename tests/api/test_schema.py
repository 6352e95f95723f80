"""Requests made from /openapi.json (schemathesis): whatever is sent, no route answers 500.

Examples per route: ``API_SCHEMA_EXAMPLES`` (default 15, small for CI). The event
streams are left out: they answer for as long as their workflow runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import response_schema_conformance

from flowstream.api.app import create_app
from flowstream.api.context import ApiConfig
from lifecycle.keys import Keys
from tests.api.conftest import OPERATE_TOKEN, TOKENS, run_server

EXAMPLES = int(os.environ.get("API_SCHEMA_EXAMPLES", "15"))


@pytest.fixture(scope="module")
def api_url(redis_url: str) -> Iterator[str]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    server, thread, url = run_server(ApiConfig(client, Keys(), TOKENS))
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(5)
        client.flushdb()
        client.close()


# The document the server serves, made without one (building the app opens no connection).
schema = schemathesis.openapi.from_dict(
    create_app(ApiConfig(redis.Redis(), Keys(), TOKENS)).openapi()
).exclude(path_regex=r".*/stream$")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_no_request_fails_with_500_and_answers_match_the_document(case: Any, api_url: str) -> None:
    response = case.call(base_url=api_url, headers={"Authorization": f"Bearer {OPERATE_TOKEN}"})
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text}"
    # What a route documents it answers, it answers in that shape.
    case.validate_response(response, checks=[response_schema_conformance])
