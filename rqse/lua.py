"""Lua scripts shipped in a package's ``scripts/`` folder, registered on a client when used.

rqse's own scripts are in ``rqse/scripts``; other packages pass their folder
(``scripts_dir(__file__)``), so every script in the project is loaded one way.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import redis
from redis.commands.core import Script

__all__ = ["load_script", "script_source", "scripts_dir"]


def scripts_dir(module_file: str) -> Path:
    """The ``scripts`` folder beside ``module_file`` (a module's ``__file__``)."""
    return Path(module_file).with_name("scripts")


_DIR = scripts_dir(__file__)


@cache
def script_source(name: str, directory: Path = _DIR) -> str:
    """The text of ``<directory>/<name>.lua``, read once."""
    return (directory / f"{name}.lua").read_text(encoding="utf-8")


def load_script(client: redis.Redis, name: str, directory: Path = _DIR) -> Script:
    """``<directory>/<name>.lua`` registered on ``client`` (EVALSHA, EVAL on NOSCRIPT)."""
    return client.register_script(script_source(name, directory))
