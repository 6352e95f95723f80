"""Lua scripts shipped in ``workers/scripts/*.lua``, registered on a client when first used."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import redis
from redis.commands.core import Script

__all__ = ["load_script"]

_DIR = Path(__file__).with_name("scripts")


@cache
def _source(name: str) -> str:
    return (_DIR / f"{name}.lua").read_text(encoding="utf-8")


def load_script(client: redis.Redis, name: str) -> Script:
    """``workers/scripts/<name>.lua`` registered on ``client`` (EVALSHA, EVAL on NOSCRIPT)."""
    return client.register_script(_source(name))
