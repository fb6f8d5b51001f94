"""kubectl against the sandbox: discovery of a new CRD by short name, selectors, CLI errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from snooze.sandbox import Sandbox

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gadgets.example.dev"},
    "spec": {
        "group": "example.dev",
        "scope": "Namespaced",
        "names": {
            "plural": "gadgets",
            "singular": "gadget",
            "kind": "Gadget",
            "shortNames": ["gdg"],
        },
        "versions": [
            {"name": "v1", "served": True, "storage": True, "subresources": {"status": {}}}
        ],
    },
}


@pytest.fixture
def kubectl(sandbox: Sandbox, tmp_path: Path) -> Any:
    config = sandbox.write_kubeconfig(tmp_path / "kubeconfig")
    env = {**os.environ, "KUBECONFIG": str(config), "KUBECACHEDIR": str(tmp_path / "cache")}

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", *args], env=env, input=stdin, capture_output=True, text=True, timeout=30
        )

    return run


def test_crd_shortname_after_creation(kubectl: Any) -> None:
    assert kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(CRD)).returncode == 0
    gadget = {"apiVersion": "example.dev/v1", "kind": "Gadget", "metadata": {"name": "g1"}}
    created = kubectl("create", "--validate=false", "-f", "-", stdin=json.dumps(gadget))
    assert created.returncode == 0, created.stderr
    listed = kubectl("get", "gdg", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert [i["metadata"]["name"] for i in json.loads(listed.stdout)["items"]] == ["g1"]
    table = kubectl("get", "gdg")
    assert table.stdout.split()[:3] == ["NAME", "AGE", "g1"]
    kubectl("delete", "crd", "gadgets.example.dev")
    assert kubectl("get", "gadgets.example.dev").returncode != 0


def test_pods_with_labels(kubectl: Any) -> None:
    assert kubectl("run", "kpod", "--image=busybox", "--labels=app=k").returncode == 0
    assert kubectl("get", "pods", "-l", "app=k", "-o", "name").stdout.split() == ["pod/kpod"]
    assert kubectl("get", "pods", "-l", "app!=k", "-o", "name").stdout.split() == []
    assert kubectl("delete", "pod", "kpod").returncode == 0


def test_cli_refuses_a_port_in_use(sandbox: Sandbox, tmp_path: Path) -> None:
    port = sandbox.url.rsplit(":", 1)[1]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "snooze.cli",
            "sandbox",
            "--port",
            port,
            "--kubeconfig",
            str(tmp_path / "k"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "in use" in result.stderr
