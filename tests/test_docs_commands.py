"""Every `python -m` command in a code block of the README and docs/ is one the program
accepts as written: its options exist, and the modules, classes, flows and directories
it names exist. (The README's blocks, examples/ and the tutorial also run for real:
tests/test_readme.py, tests/test_tutorial.py; the benchmarks are not run here.)"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from flowlang.cli import _parser as flowlang_parser
from flowstream.cli import COMMANDS
from lifecycle.cli.main import build_parser
from tests.shell import block_commands
from workers.cli import _parser as workers_parser
from workers.runner import load_listener_class

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "lifecycle": lambda: build_parser(COMMANDS),
    "workers": workers_parser,
    "flowlang": flowlang_parser,
}
# Words that stand for what the reader supplies (an archive's directory, an id):
# accepted as they are, since the programs only read them when run.
PLACEHOLDERS = ("ARCHIVE", "DIR", "<id>", "orders-42")


def documented_commands() -> list[tuple[str, str]]:
    """(page:line, command) for each `python -m` program command in a code block."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
            if block[1] not in ("", "sh"):
                continue
            line = text.count("\n", 0, block.start()) + 1
            for command in block_commands(block[2]):
                command = re.sub(r"^\.venv/bin/", "", command.split(" && ")[-1])
                if not command.startswith("python -m ") or "──" in command:
                    continue  # a diagram, a flow, a config line
                if re.search(r"(^|\s)\[|\.\.\.|\s\|\s", command):
                    continue  # a synopsis ([--option X], ID..., a | b), not a command
                words = shlex.split(command)
                if words[:2] == ["python", "-m"] and words[2] in PARSERS:
                    found.append((f"{page.relative_to(ROOT)}:{line}", command))
    return found


COMMANDS_FOUND = documented_commands()


def test_the_docs_hold_commands_of_each_program() -> None:
    programs = {shlex.split(command)[2] for _, command in COMMANDS_FOUND}
    assert programs == set(PARSERS)


@pytest.mark.parametrize(("where", "command"), COMMANDS_FOUND, ids=[w for w, _ in COMMANDS_FOUND])
def test_a_documented_command_is_accepted_as_written(
    where: str, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))  # as python -m puts the working directory first
    words: list[str] = []
    for word in shlex.split(command):  # a glob: the files it matches, as a shell expands it
        if "*" in word and " " not in word:  # a quoted cron expression is no glob
            matches = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(word))
            assert matches, f"{where}: `{command}`: {word} matches nothing"
            words += matches
        else:
            words.append(word)
    program, argv = words[2], words[3:]
    refused = io.StringIO()
    with contextlib.redirect_stderr(refused):
        try:
            args = PARSERS[program]().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: `{command}` refused: {refused.getvalue().strip()}")
    target = getattr(args, "target", None)
    if program == "workers" and target:
        assert load_listener_class(target), f"{where}: {target}"
    for name in ("file", "files", "base_dir"):  # what they read (an archive is written first)
        value = getattr(args, name, None)
        for path in value if isinstance(value, list) else [value]:
            if path is None or str(path) in PLACEHOLDERS or str(path) == "-":
                continue
            assert Path(path).exists(), f"{where}: `{command}` names {path}, which does not exist"
