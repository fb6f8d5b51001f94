"""kubectl against the sandbox: discovery of a new CRD by short name, selectors, CLI errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from snooze.sandbox import Sandbox

pytestmark = pytest.mark.needs("kubectl")

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
    assert kubectl("apply", "-f", "-", stdin=json.dumps(CRD)).returncode == 0
    gadget = {"apiVersion": "example.dev/v1", "kind": "Gadget", "metadata": {"name": "g1"}}
    created = kubectl("create", "-f", "-", stdin=json.dumps(gadget))
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


def test_crd_printer_columns(kubectl: Any, sandbox: Sandbox) -> None:
    crd = Path(__file__).parents[2] / "crds" / "inferencemodels.snooze.dev.yaml"
    applied = kubectl("apply", "-f", str(crd))
    assert applied.returncode == 0, applied.stderr
    model = {
        "apiVersion": "snooze.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": "llama"},
        "spec": {"selector": {"matchLabels": {"app": "llama"}}},
    }
    created = kubectl("create", "-f", "-", stdin=json.dumps(model))
    assert created.returncode == 0, created.stderr
    status = {"phase": "Asleep", "modelName": "meta/llama-3", "awake": 0, "asleep": 2}
    patched = httpx.patch(
        f"{sandbox.url}/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels/llama/status",
        content=json.dumps({"status": status}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert patched.status_code == 200, patched.text
    lines = kubectl("get", "im").stdout.splitlines()
    assert lines[0].split() == ["NAME", "MODEL", "PHASE", "AWAKE", "ASLEEP", "LAST", "WAKE", "AGE"]
    assert lines[1].split()[:5] == ["llama", "meta/llama-3", "Asleep", "0", "2"]
    assert lines[1].split()[-1].endswith("s")  # an age, not a timestamp
    wide = kubectl("get", "im", "llama", "-o", "wide").stdout.splitlines()
    assert "WAKE SECONDS" in wide[0]
    assert "WAKE SECONDS" not in lines[0]
    assert kubectl("delete", "crd", "inferencemodels.snooze.dev").returncode == 0


def test_event_columns(kubectl: Any, sandbox: Sandbox) -> None:
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "llama.1"},
        "involvedObject": {"kind": "InferenceModel", "name": "llama", "namespace": "default"},
        "type": "Normal",
        "reason": "Slept",
        "message": "put 2 engines to sleep ",
        "source": {"component": "snooze"},
        "lastTimestamp": "2020-01-01T00:00:00Z",
    }
    created = kubectl("create", "-f", "-", stdin=json.dumps(event))
    assert created.returncode == 0, created.stderr
    lines = kubectl("get", "events").stdout.splitlines()
    assert lines[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    row = lines[1].split()
    assert row[0].endswith(("y", "d")) and row[1:4] == ["Normal", "Slept", "inferencemodel/llama"]
    assert " ".join(row[4:]) == "put 2 engines to sleep"
    wide = kubectl("get", "events", "-o", "wide").stdout.splitlines()
    headers = ["SUBOBJECT", "SOURCE", "MESSAGE", "FIRST", "SEEN", "COUNT", "NAME"]
    assert wide[0].split()[5:] == headers
    assert wide[1].split()[-2:] == ["1", "llama.1"]
    assert kubectl("delete", "event", "llama.1").returncode == 0


def test_pod_columns(kubectl: Any, sandbox: Sandbox) -> None:
    assert kubectl("run", "cols", "--image=busybox").returncode == 0
    status = {
        "phase": "Running",
        "podIP": "10.0.0.7",
        "podIPs": [{"ip": "10.0.0.7"}],
        "containerStatuses": [
            {"name": "cols", "ready": True, "restartCount": 3, "state": {"running": {}}}
        ],
    }
    patched = httpx.patch(
        f"{sandbox.url}/api/v1/namespaces/default/pods/cols/status",
        content=json.dumps({"status": status}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert patched.status_code == 200, patched.text
    lines = kubectl("get", "pods").stdout.splitlines()
    assert lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert lines[1].split()[:4] == ["cols", "1/1", "Running", "3"]
    wide = kubectl("get", "pod", "cols", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[5:7] == ["IP", "NODE"]
    assert wide[1].split()[5:7] == ["10.0.0.7", "<none>"]
    assert kubectl("delete", "pod", "cols").returncode == 0
