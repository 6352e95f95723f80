"""Run the shell commands of a Markdown page as written, on the test's Redis.

A page's ```sh blocks are read line by line (a trailing ``\\`` joins lines, ``#``
starts a comment). ``python`` is the interpreter running the tests (a ``python``
on PATH in a temporary directory), the working directory is the repository, and
each command runs under ``bash`` as written after the substitutions a test
states (``/var/lib/flow/receipts`` -> a temporary directory, say). ``<id>`` is
the workflow id the last ``run`` printed first. ``export NAME=VALUE`` sets the
variable for the commands after it.

Long-running commands (workers) start in the background and are stopped, by
their process id, when the :class:`Shell` is closed; the others must exit 0
unless a test says otherwise.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parent.parent

# `python -m MODULE COMMAND` pairs that serve until stopped.
SERVING = {
    ("lifecycle", "worker"),
    ("lifecycle", "receipts"),
    ("workers", "noop"),
    ("workers", "simulate"),
    ("workers", "run"),
    ("workers", "wait"),
    ("workers", "resource"),
}
ID_PLACEHOLDER = "<id>"


def shell_blocks(markdown: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", markdown, flags=re.S)


def block_commands(block: str) -> list[str]:
    """The commands of a shell block: comments dropped, continued lines joined."""
    commands: list[str] = []
    pending = ""
    for line in block.splitlines():
        line = pending + line
        pending = ""
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        command = _without_comment(line).strip()
        if command:
            commands.append(command)
    return commands


def _without_comment(line: str) -> str:
    """The line up to an unquoted ``#`` that starts a word."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


@dataclass
class Ran:
    command: str
    code: int
    out: str
    err: str


class Shell:
    """Runs commands as a reader of the page would type them, in ``cwd``."""

    def __init__(
        self,
        tmp: Path,
        env: Mapping[str, str] | None = None,
        substitutions: Mapping[str, str] | None = None,
        cwd: Path = ROOT,
        merged: bool = False,
        skip: tuple[str, ...] = (),
        expect: Mapping[str, int] | None = None,
    ) -> None:
        """``merged``: stderr into stdout, as a terminal shows them (``err`` stays empty).
        ``skip``: commands containing one of these texts are not run. ``expect``: the
        exit code of the commands containing a text, where not 0."""
        bin_dir = tmp / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        python = bin_dir / "python"
        # A script, not a symlink: a venv's interpreter finds its packages by its path.
        python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n', encoding="utf-8")
        python.chmod(0o755)
        base = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_")}
        base["PATH"] = f"{bin_dir}{os.pathsep}{base.get('PATH', '')}"
        base["PYTHONUNBUFFERED"] = "1"
        base["COLUMNS"] = "120"  # tables as a terminal of that width shows them
        self.env = {**base, **(env or {})}
        self.substitutions = dict(substitutions or {})
        self.cwd = cwd
        self.merged = merged
        self.skip = skip
        self.expect = dict(expect or {})
        self.logs = tmp / "logs"
        self.logs.mkdir(exist_ok=True)
        self.background: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.log_files: dict[str, Path] = {}  # each background command's output
        self.last_id: str | None = None
        self.history: list[Ran] = []

    def substitute(self, command: str) -> str:
        for old, new in self.substitutions.items():
            command = command.replace(old, new)
        if ID_PLACEHOLDER in command:
            assert self.last_id, f"{command}: no workflow id printed before"
            command = command.replace(ID_PLACEHOLDER, self.last_id)
        return command

    def run_all(self, commands: Iterable[str], timeout: float = 60) -> list[Ran]:
        return [r for c in commands if (r := self.run(c, timeout)) is not None]

    def run(self, command: str, timeout: float = 60, expect: int | None = 0) -> Ran | None:
        """Run ``command``; a serving one in the background (None). ``expect``: the exit
        code required (None: any) unless the Shell's ``expect`` names one."""
        if any(text in command for text in self.skip):
            return None
        expect = next((c for text, c in self.expect.items() if text in command), expect)
        command = self.substitute(command)
        exported = re.fullmatch(r"export (\w+)=(\S+)", command)
        if exported:
            self.env[exported[1]] = os.path.expandvars(exported[2])
            return None
        if _serves(command):
            self.start(command)
            return None
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if self.merged else subprocess.PIPE,
            timeout=timeout,
            check=False,
        )
        err = "" if self.merged else done.stderr.decode()
        ran = Ran(command, done.returncode, done.stdout.decode(), err)
        self.history.append(ran)
        if expect is not None:
            assert ran.code == expect, (
                f"`{command}` exited {ran.code}, expected {expect}\n"
                f"stdout:\n{ran.out}\nstderr:\n{ran.err}\n{self.background_logs()}"
            )
        if re.search(r"-m lifecycle run\b", command) and ran.out:
            self.last_id = ran.out.splitlines()[0].strip()
        return ran

    def start(self, command: str) -> subprocess.Popen[bytes]:
        n = len(self.log_files)
        self.log_files[command] = self.logs / f"{n}.log"
        log = self.log_files[command].open("wb")
        # exec: the process id is the worker's own, so stopping it is one signal.
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=self.cwd,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.background.append((command, proc))
        time.sleep(0.2)
        assert proc.poll() is None, f"`{command}` exited at once:\n{self.background_logs()}"
        return proc

    def log_of(self, command: str) -> str:
        """What the background ``command`` (as substituted) printed so far."""
        return self.log_files[self.substitute(command)].read_text(errors="replace")

    def background_logs(self) -> str:
        parts = []
        for command, path in self.log_files.items():
            text = path.read_text(errors="replace")
            parts.append(f"--- {command}\n{text[-3000:]}")
        return "\n".join(parts)

    def close(self) -> list[int]:
        """Stop the background commands (SIGTERM, SIGKILL after 10 s); their exit codes."""
        for _, proc in self.background:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = []
        for _, proc in self.background:
            try:
                codes.append(proc.wait(timeout=10))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        self.background.clear()
        return codes


def _serves(command: str) -> bool:
    words = shlex.split(command)
    for i, word in enumerate(words[:-2]):
        if word == "-m" and (words[i + 1], words[i + 2]) in SERVING:
            return True
    return False
