"""The fault scenarios of tests/reliability at full size, and their figures as a table.

    python -m bench.faults                 # every scenario (long: the 1,000,000-item fan-out)
    python -m bench.faults kill oom        # those whose test name or figure name has a word

Runs ``pytest tests/reliability`` with ``FLOWSTREAM_FAULTS_FULL=1`` (the full sizes)
and ``FLOWSTREAM_FAULTS_REPORT`` pointing at a temporary file where each scenario
appends its figures, then prints one row per scenario: the figures behind
docs/reliability.md. Exit status: pytest's (1 when a scenario failed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

# Figures every row shows first; the rest follow as name=value.
LEADING = ("workflows", "items", "seconds", "seconds_after_restart", "seconds_after_release")


def table(lines: list[dict]) -> str:
    rows = ["| scenario | size | figures |", "|---|---|---|"]
    for line in lines:
        name = line.pop("scenario")
        full = "full" if line.pop("full") else "CI"
        shown = [f"{k}={line.pop(k)}" for k in LEADING if k in line]
        shown += [f"{k}={v}" for k, v in line.items()]
        rows.append(f"| {name} | {full} | {', '.join(shown)} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("names", nargs="*", help="words of the scenarios to run (pytest -k)")
    parser.add_argument("--ci", action="store_true", help="the CI sizes, not the full ones")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="faults-") as directory:
        report = Path(directory) / "figures.jsonl"
        env = {**os.environ, "FLOWSTREAM_FAULTS_REPORT": str(report)}
        if not args.ci:
            env["FLOWSTREAM_FAULTS_FULL"] = "1"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s"]
        command += ["--timeout", "0"]  # full sizes run longer than the suite's 300 s per test
        command += ["tests/reliability", "--ignore", "tests/reliability/test_task_workers.py"]
        if args.names:
            command += ["-k", " or ".join(args.names)]
        status = subprocess.run(command, env=env, stdout=sys.stderr).returncode
        lines = (
            [orjson.loads(x) for x in report.read_bytes().splitlines()] if report.exists() else []
        )
    print(table(lines) if lines else "no scenario recorded figures")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
