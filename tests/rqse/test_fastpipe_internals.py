"""The redis-py internals rqse.fastpipe reads are there, in the redis-py installed.

fastpipe falls back to redis-py's own (slower) reading when they are missing;
this test is what says so, loudly, when a redis-py release moves them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from rqse import fastpipe

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


@pytest.mark.parametrize("protocol", [2, 3])
def test_every_redis_py_internal_fastpipe_relies_on_is_there(redis_url, protocol):
    client = redis.Redis.from_url(f"{redis_url}?protocol={protocol}")
    missing = fastpipe.internals_missing(client)
    assert not missing, (
        f"redis-py {redis.__version__} changed internals rqse/fastpipe.py relies on: "
        f"{'; '.join(missing)}. Pin redis below this version in pyproject.toml, "
        "or adapt rqse/fastpipe.py (and the listener's raw read) to it."
    )


def test_the_installed_redis_py_is_within_the_pinned_range():
    pin = re.search(r'"redis\[hiredis\]>=([\d.]+),<([\d.]+)"', PYPROJECT.read_text())
    assert pin, "pyproject.toml pins redis as redis[hiredis]>=LOW,<HIGH"
    low, high = (tuple(int(p) for p in bound.split(".")) for bound in pin.groups())
    installed = tuple(int(p) for p in re.findall(r"\d+", redis.__version__)[:3])
    assert low <= installed < high, (
        f"redis-py {redis.__version__} is outside the range rqse was tested with "
        f"(>={pin.group(1)},<{pin.group(2)})"
    )
