"""What the tests of deploy/ read: the Compose file, the kustomizations (rendered when a
kustomize binary is there), the command lines they run and the parsers that take them."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
IMAGE = "flowstream"  # the base's image name; the overlay maps it to a registry
KUSTOMIZATIONS = [K8S / "base", K8S / "overlays" / "example"]


def kustomize_binary() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects of a kustomization: rendered by kustomize when a binary is there,
    else each listed file read as it is (after checking every listed path exists)."""
    binary = kustomize_binary()
    if binary:
        out = subprocess.run([*binary, str(directory)], capture_output=True, text=True)
        assert out.returncode == 0, f"{' '.join(binary)} {directory}: {out.stderr}"
        return [d for d in yaml.safe_load_all(out.stdout) if d]
    return read_unrendered(directory)


def read_unrendered(directory: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    objects: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        path = (directory / resource).resolve()
        assert path.exists(), f"{directory}/kustomization.yaml: resource {resource} missing"
        if path.is_dir():
            objects += read_unrendered(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return objects


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


def compose_file() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return data


def served_kind(args: list[str]) -> str:
    """The task kind a `workers ...` command line serves."""
    if args[:2] == ["workers", "resource"]:
        return "resource"
    assert args[:2] == ["workers", "run"], args
    module, _, name = args[2].partition(":")
    sys.path.insert(0, str(ROOT))
    try:
        import importlib

        return str(getattr(importlib.import_module(module), name).kind)
    finally:
        sys.path.remove(str(ROOT))


def command_lines() -> list[tuple[str, list[str]]]:
    """(where, ["lifecycle"|"workers", args...]) for every flowstream command in the
    compose file and the rendered manifests: containers (the image's entrypoint is
    `python -m`) and exec probes (`python -m ...`)."""
    lines: list[tuple[str, list[str]]] = []
    for name, service in compose_file()["services"].items():
        if name != "redis":
            lines.append((f"compose {name}", list(map(str, service["command"]))))
        test = list(map(str, service["healthcheck"]["test"]))
        if test[1:3] == ["python", "-m"]:
            lines.append((f"compose {name} healthcheck", test[3:]))
    for directory in KUSTOMIZATIONS:
        for name, pod in pod_specs(render(directory)):
            for container in pod["containers"]:
                if container["image"].split("/")[-1].split(":")[0] != IMAGE:
                    continue
                lines.append((f"{directory.name} {name}", list(map(str, container["args"]))))
                for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                    command = container.get(probe, {}).get("exec", {}).get("command", [])
                    if command[:2] == ["python", "-m"]:
                        lines.append((f"{directory.name} {name} {probe}", command[2:]))
    return lines


def workers_parser() -> argparse.ArgumentParser:
    from workers.cli import _parser

    return _parser()
