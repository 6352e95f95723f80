"""deploy/k8s and the command lines of every manifest, checked offline.

Kubernetes objects are validated against the Kubernetes schemas with
kubernetes-validate (strict: an unknown field fails). KEDA's ScaledObject and
TriggerAuthentication are custom resources it has no schema for: they are skipped
there and their required fields checked here instead, with what they must agree on
(the stream and group names of lifecycle.keys, the Deployment they scale).
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from typing import Any

import pytest

from flowstream.cli import COMMANDS
from lifecycle.cli.main import build_parser
from lifecycle.keys import TASK_GROUP, Keys
from tests.deploy.deploy_files import (
    DEPLOY,
    KUSTOMIZATIONS,
    ROOT,
    command_lines,
    compose_file,
    pod_specs,
    read_unrendered,
    render,
    served_kind,
    workers_parser,
)

KUBERNETES_VERSION = "1.30.0"
KEDA_KINDS = {"ScaledObject", "TriggerAuthentication"}


@pytest.fixture(scope="module", params=KUSTOMIZATIONS, ids=lambda p: p.name)
def rendered(request: Any) -> list[dict[str, Any]]:
    return render(request.param)


def test_every_yaml_file_of_deploy_passes_yamllint() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "yamllint", "-f", "parsable", "-c", str(DEPLOY / ".yamllint"), "."],
        cwd=DEPLOY,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_kustomization_lists_files_that_exist() -> None:
    for directory in KUSTOMIZATIONS:
        assert read_unrendered(directory)


def test_every_kubernetes_object_is_valid_against_the_kubernetes_schemas(
    rendered: list[dict[str, Any]],
) -> None:
    import kubernetes_validate  # type: ignore[import-untyped]

    checked = 0
    for obj in rendered:
        if obj["kind"] in KEDA_KINDS:  # no schema there: test_keda_* checks them
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except Exception as error:  # its own ValidationError or jsonschema's
            message = getattr(error, "message", str(error))
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {message}")
        checked += 1
    assert checked >= 12


def test_every_container_has_resources_a_probe_and_runs_unprivileged(
    rendered: list[dict[str, Any]],
) -> None:
    for name, pod in pod_specs(rendered):
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for container in pod["containers"]:
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), name
            assert "memory" in resources["limits"], name
            assert "livenessProbe" in container or "readinessProbe" in container, name
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, name


def test_each_worker_kind_has_a_deployment_and_receipts_a_statefulset_with_a_claim(
    rendered: list[dict[str, Any]],
) -> None:
    deployments = {o["metadata"]["name"] for o in rendered if o["kind"] == "Deployment"}
    assert {
        "flowstream-lifecycle",
        "flowstream-resource",
        "flowstream-shop",
        "flowstream-api",
    } <= deployments
    [receipts] = [
        o
        for o in rendered
        if o["metadata"]["name"] == "flowstream-receipts" and o["kind"] == "StatefulSet"
    ]
    [claim] = receipts["spec"]["volumeClaimTemplates"]
    mounts = receipts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    args = receipts["spec"]["template"]["spec"]["containers"][0]["args"]
    archive = args[args.index("--archive") + 1]
    assert {"name": claim["metadata"]["name"], "mountPath": archive} in mounts


def test_every_deployment_has_a_disruption_budget_selecting_its_pods(
    rendered: list[dict[str, Any]],
) -> None:
    budgets = [
        o["spec"]["selector"]["matchLabels"] for o in rendered if o["kind"] == "PodDisruptionBudget"
    ]
    for obj in rendered:
        if obj["kind"] != "Deployment":
            continue
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert any(b.items() <= labels.items() for b in budgets), obj["metadata"]["name"]


def test_secrets_come_from_kubernetes_secrets_and_never_from_literal_env(
    rendered: list[dict[str, Any]],
) -> None:
    for name, pod in pod_specs(rendered):
        for container in pod["containers"]:
            for env in container.get("env", []):
                assert not re.search(r"PASSWORD|TOKEN|SECRET", env["name"]), (name, env)
                assert "://" not in env.get("value", ""), (name, env)
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"].startswith("flowstream-"), name
    assert not [o for o in rendered if o["kind"] == "Secret"], "Secrets are made outside"
    # Each workload reads its own user's URL: the keys docs/deploy.md fills from the
    # files make-secrets.sh writes (redis-url-<key>).
    keys = {
        name: item["key"]
        for name, pod in pod_specs(rendered)
        for volume in pod.get("volumes", [])
        if volume.get("secret", {}).get("secretName") == "flowstream-redis"
        for item in volume["secret"]["items"]
    }
    assert keys == {
        "flowstream-lifecycle": "lifecycle",
        "flowstream-receipts": "receipts",
        "flowstream-resource": "resource",
        "flowstream-shop": "shop",
        "flowstream-api": "admin",
    }
    script = (DEPLOY / "make-secrets.sh").read_text()
    assert all(f"{key}:" in script for key in keys.values())


def test_keda_scales_each_task_worker_on_its_stream_lag_with_the_required_fields(
    rendered: list[dict[str, Any]],
) -> None:
    """The redis-streams scaler's required fields (the KEDA CRDs are not validated by
    kubernetes-validate): a target that is a Deployment here, the kind's stream by
    lifecycle.keys, the group `workers`, lagCount a positive integer in a string, and
    an authenticationRef to a TriggerAuthentication here whose secret gives an address."""
    objects = {(o["kind"], o["metadata"]["name"]): o for o in rendered}
    scaled = [o for o in rendered if o["kind"] == "ScaledObject"]
    assert {o["spec"]["scaleTargetRef"]["name"] for o in scaled} == {
        "flowstream-shop",
        "flowstream-resource",
    }
    keys = Keys()
    for obj in scaled:
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        target = objects[("Deployment", obj["spec"]["scaleTargetRef"]["name"])]
        kind = served_kind(target["spec"]["template"]["spec"]["containers"][0]["args"])
        assert 1 <= obj["spec"]["minReplicaCount"] <= obj["spec"]["maxReplicaCount"]
        [trigger] = obj["spec"]["triggers"]
        assert trigger["type"] == "redis-streams"
        metadata = trigger["metadata"]
        assert metadata["stream"] == keys.tasks(kind)
        assert metadata["consumerGroup"] == TASK_GROUP
        assert isinstance(metadata["lagCount"], str) and int(metadata["lagCount"]) > 0
        auth = objects[("TriggerAuthentication", trigger["authenticationRef"]["name"])]
        parameters = {r["parameter"] for r in auth["spec"]["secretTargetRef"]}
        assert "address" in parameters and {"name", "key"} <= set(
            auth["spec"]["secretTargetRef"][0]
        )


def test_each_task_worker_probe_names_the_kind_the_worker_serves(
    rendered: list[dict[str, Any]],
) -> None:
    """A kind enters {flow}:kinds only when a flow uses it: the probe must name it."""
    probes = []
    for name, pod in pod_specs(rendered):
        for container in pod["containers"]:
            if container["args"][0] == "workers":
                for probe in ("startupProbe", "livenessProbe"):
                    probes.append((name, container["args"], container[probe]["exec"]["command"]))
    for name, service in compose_file()["services"].items():
        if service["command"][0] == "workers":
            probes.append((name, service["command"], service["healthcheck"]["test"]))
    assert len(probes) >= 6
    for name, args, probe in probes:
        assert "--alive" in probe, name
        assert probe[probe.index("--kind") + 1] == served_kind(args), name


def test_the_overlay_runs_redis_with_aof_everysec_and_noeviction() -> None:
    [redis_set] = [
        o
        for o in render(KUSTOMIZATIONS[1])
        if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "redis"
    ]
    args = " ".join(redis_set["spec"]["template"]["spec"]["containers"][0]["args"])
    for setting in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"):
        assert setting in args


def test_health_check_scripts_compile() -> None:
    scripts = [s["healthcheck"]["test"] for s in compose_file()["services"].values()]
    for _, pod in pod_specs(render(KUSTOMIZATIONS[0])):
        for container in pod["containers"]:
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                if "exec" in container.get(probe, {}):
                    scripts.append(container[probe]["exec"]["command"])
    inline = [
        s[s.index("-c") + 1]
        for s in scripts
        if s[:3] in (["CMD", "python", "-c"], ["python", "-c"])
    ]
    assert inline
    for code in inline:
        compile(code, "<health check>", "exec")


def test_every_command_line_in_the_manifests_parses_with_the_shipped_programs() -> None:
    parsers = {"lifecycle": build_parser(COMMANDS), "workers": workers_parser()}
    lines = command_lines()
    assert len(lines) >= 15
    for where, (program, *argv) in lines:
        parser = parsers[program]
        errors = io.StringIO()
        with contextlib.redirect_stderr(errors):
            try:
                args = parser.parse_args(argv)
            except SystemExit:
                pytest.fail(f"{where}: python -m {program} {' '.join(argv)}: {errors.getvalue()}")
        assert callable(getattr(args, "func", None)) or program == "workers", where


def test_every_command_named_in_the_manifests_answers_help() -> None:
    commands = {(program, argv[0]) for _, (program, *argv) in command_lines()}
    for program, command in sorted(commands):
        out = subprocess.run(
            [sys.executable, "-m", program, command, "--help"], capture_output=True, cwd=ROOT
        )
        assert out.returncode == 0, f"python -m {program} {command} --help: {out.stderr!r}"
