"""A private Redis server and worker processes per scenario (they kill and reconfigure it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.reliability.helpers import Engine


@pytest.fixture
def engine_factory(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    """``engine_factory(persistence="aof-always", extra=[...], pack_starts=False)``: a
    fresh engine, stopped at teardown."""
    made: list[Engine] = []

    def make(persistence: str = "none", extra: list[str] = (), pack_starts: bool = False) -> Engine:
        engine = Engine(tmp_path / f"engine-{len(made)}", persistence, extra, pack_starts)
        made.append(engine)
        return engine

    try:
        yield make
    finally:
        for engine in made:
            engine.stop()
