"""The workers' Lua scripts (``workers/scripts/*.lua``), loaded through :mod:`rqse.lua`."""

from __future__ import annotations

import redis
from redis.commands.core import Script

from rqse import lua

__all__ = ["load_script"]

_DIR = lua.scripts_dir(__file__)


def load_script(client: redis.Redis, name: str) -> Script:
    """``workers/scripts/<name>.lua`` registered on ``client``."""
    return lua.load_script(client, name, _DIR)
