"""What `helm install` prints (NOTES.txt) works as printed: its kubectl commands run against a
Kubernetes API (the sandbox) holding the rendered release, and the addresses it gives are the
gateway Service's."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from chart_helpers import CRDS, load_yaml
from rendering import VALUE_SETS, render

from snooze.sandbox import Sandbox

pytestmark = pytest.mark.needs("kubectl")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Sandbox, dict[str, str]]]:
    with Sandbox() as sandbox:
        kubeconfig = sandbox.write_kubeconfig(tmp_path / "kubeconfig")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "KUBECACHEDIR": str(tmp_path)}
        yield sandbox, env


def create(sandbox: Sandbox, obj: dict[str, Any]) -> None:
    group, _, version = obj["apiVersion"].rpartition("/")
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    plural = {"Service": "services", "Namespace": "namespaces"}.get(obj["kind"])
    if obj["kind"] == "CustomResourceDefinition":
        plural = "customresourcedefinitions"
    assert plural, obj["kind"]
    namespace = obj["metadata"].get("namespace")
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    httpx.post(sandbox.url + path, json=obj, timeout=10).raise_for_status()


@pytest.mark.parametrize("value_set", ["defaults", "everything"])
@pytest.mark.parametrize("release", ["snooze", "a-release-name-as-long-as-helm-allows-it-53c"])
def test_the_notes_commands_work_as_printed(
    cluster: tuple[Sandbox, dict[str, str]], value_set: str, release: str
) -> None:
    sandbox, env = cluster
    rendering = render(VALUE_SETS[value_set], release=release, namespace="ai")
    create(sandbox, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ai"}})
    for crd in sorted(CRDS.glob("*.yaml")):
        create(sandbox, load_yaml(crd))
    for service in rendering.of_kind("Service"):
        create(sandbox, {**service, "metadata": {**service["metadata"], "namespace": "ai"}})
    notes = rendering.notes
    commands = [line.strip() for line in notes.splitlines() if line.strip().startswith("kubectl ")]
    assert len(commands) == 2, notes

    # The port-forward: to the gateway Service, on its port; curl then asks the local port.
    forward = re.fullmatch(r"kubectl -n (\S+) port-forward svc/(\S+) (\d+):(\d+)", commands[0])
    assert forward, commands[0]
    namespace, service, local, remote = forward.groups()
    ports = subprocess.run(
        [
            "kubectl",
            "-n",
            namespace,
            "get",
            f"svc/{service}",
            "-o",
            "jsonpath={.spec.ports[*].port}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ports.returncode == 0, ports.stderr
    assert remote in ports.stdout.split()
    assert f"curl http://127.0.0.1:{local}/v1/models" in notes
    assert f"http://{service}.{namespace}.svc:{remote}/v1" in notes

    # Listing the models: as printed, and unambiguous (group given).
    listed = subprocess.run(
        shlex.split(commands[1]), env=env, capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    assert "inferencemodels.snooze.dev" in commands[1]
