"""deploy/Dockerfile: checked as text always, built when a Docker engine answers."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.deploy.deploy_files import (
    DEPLOY,
    ROOT,
)


def _stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined), per stage."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_the_dockerfile_copies_every_package_and_the_dockerignore_lets_it_through() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    build = _stages()[0]
    copied = {line.split()[1] for line in build if line.startswith("COPY ")}
    assert packages <= copied, f"packages not copied into the build stage: {packages - copied}"
    allowed = {
        line.strip("!/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert copied | {"examples"} <= allowed, copied | {"examples"} - allowed


def test_the_final_stage_is_slim_non_root_and_runs_python_m() -> None:
    stages = _stages()
    assert len(stages) == 2, "a build stage and a final stage"
    final = stages[-1]
    assert final[0].startswith("FROM ${PYTHON_IMAGE}")
    assert re.search(r"ARG PYTHON_IMAGE=python:3\.11-slim", (DEPLOY / "Dockerfile").read_text())
    users = [line for line in final if line.startswith("USER ")]
    assert users and users[-1].split()[1].split(":")[0] not in ("0", "root")
    runs = " ".join(line for line in final if line.startswith("RUN "))
    assert not re.search(r"apt-get|apk |gcc|build-essential|pip wheel", runs), runs
    assert "--no-index" in runs, "the final stage installs only the built wheels"
    assert 'ENTRYPOINT ["python", "-m"]' in final


def _docker_answers() -> str | None:
    """None when a Docker engine answers, else why not."""
    if not shutil.which("docker"):
        return "no docker binary on PATH"
    out = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        reason = (out.stderr.strip().splitlines() or ["docker info failed"])[-1]
        return f"no Docker engine answers: {reason}"
    return None


def test_the_image_builds_from_the_dockerfile_and_runs_as_non_root() -> None:
    reason = _docker_answers()
    if reason:
        pytest.skip(f"image build not tried: {reason}")
    tag = "flowstream-test:deploy"
    build = subprocess.run(
        ["docker", "build", "-f", str(DEPLOY / "Dockerfile"), "-t", tag, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    for argv in (["lifecycle", "status", "--help"], ["workers", "--help"]):
        run = subprocess.run(["docker", "run", "--rm", tag, *argv], capture_output=True)
        assert run.returncode == 0, run.stderr
    user = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "id", tag, "-u"], capture_output=True, text=True
    )
    assert user.stdout.strip() == "10001"
    tools = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "sh", tag, "-c", "command -v gcc cc make"],
        capture_output=True,
        text=True,
    )
    assert tools.stdout.strip() == "", f"build tools in the final image: {tools.stdout}"
