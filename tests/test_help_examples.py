"""The examples in `--help` name modules, classes and files that exist, and parse."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from flowstream.cli import COMMANDS
from lifecycle.cli.main import EXAMPLES, build_parser
from tests.shell import block_commands
from workers.cli import EPILOG, _parser
from workers.runner import load_listener_class

ROOT = Path(__file__).parent.parent


def examples(epilog: str, program: str) -> list[list[str]]:
    """The arguments of each example line of an epilog that runs ``program``."""
    prefix = f"python -m {program} "
    return [
        shlex.split(command)[3:] for command in block_commands(epilog) if command.startswith(prefix)
    ]


def test_workers_help_examples_parse_and_name_classes_and_directories_that_exist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)  # the examples run from the repository's root
    monkeypatch.syspath_prepend(str(ROOT))  # as python -m puts the working directory first
    found = examples(EPILOG, "workers")
    assert len(found) >= 5
    for argv in found:
        args = _parser().parse_args(argv)
        if args.command == "run":
            assert load_listener_class(args.target), argv
        if getattr(args, "base_dir", None) is not None:
            assert args.base_dir.is_dir(), argv


def test_lifecycle_help_examples_parse_and_name_files_that_exist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)
    found = examples(EXAMPLES, "lifecycle")
    assert found
    for argv in found:
        args = build_parser(COMMANDS).parse_args(argv)
        file = getattr(args, "file", None)
        assert file is None or os.path.exists(file), argv
