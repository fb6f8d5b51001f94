"""kubectl's OpenAPI v2 paths against the sandbox: explain's v2 output, client-side validation."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from snooze.sandbox import Sandbox, openapi, swagger

pytestmark = pytest.mark.needs("kubectl")

CRD = Path(__file__).parents[2] / "crds" / "inferencemodels.snooze.dev.yaml"
TYPO = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "typo"},
    "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicyy": "Always"}]},
}


def kubectl(sandbox: Sandbox, folder: Path, *args: str, stdin: str | None = None) -> str:
    config = sandbox.write_kubeconfig(folder / "kubeconfig")
    env = {**os.environ, "KUBECONFIG": str(config), "KUBECACHEDIR": str(folder / "cache")}
    result = subprocess.run(
        ["kubectl", *args], env=env, input=stdin, capture_output=True, text=True, timeout=60
    )
    return f"{result.returncode}\n{result.stdout}{result.stderr}"


def test_explain_from_openapi_v2(sandbox: Sandbox, tmp_path: Path) -> None:
    assert kubectl(sandbox, tmp_path, "apply", "-f", str(CRD)).startswith("0\n")
    out = kubectl(sandbox, tmp_path, "explain", "inferencemodel.spec.wake",
                  "--output", "plaintext-openapiv2")  # fmt: skip
    assert out.startswith("0\n") and "RESOURCE: wake <Object>" in out
    assert "onRequest\t<boolean>" in out
    pods = kubectl(sandbox, tmp_path, "explain", "pods.spec", "--output", "plaintext-openapiv2")
    assert "containers\t<[]Object> -required-" in pods


def test_openapi_v2_as_json_and_protobuf(sandbox: Sandbox) -> None:
    doc = httpx.get(f"{sandbox.url}/openapi/v2").json()
    assert doc["swagger"] == "2.0"
    pod = doc["definitions"]["io.k8s.api.core.v1.Pod"]
    assert pod["x-kubernetes-group-version-kind"] == [{"group": "", "kind": "Pod", "version": "v1"}]
    assert doc["definitions"]["io.k8s.apimachinery.pkg.util.intstr.IntOrString"]["type"] == "string"
    patch = doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"]
    assert {"name": "fieldValidation", "in": "query"}.items() <= patch["parameters"][1].items()
    asked = {"Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"}
    protobuf = httpx.get(f"{sandbox.url}/openapi/v2", headers=asked)
    assert protobuf.headers["Content-Type"] == swagger.PROTOBUF
    assert protobuf.content == swagger.encode(doc)
    # A string field, as protobuf frames it: tag (field 1, length-delimited), length, bytes.
    assert protobuf.content.startswith(b"\x0a\x032.0")


def test_kubectl_validates_client_side_where_the_server_does_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A server whose documents do not offer fieldValidation: kubectl validates with v2 itself.
    monkeypatch.setitem(openapi.FIELD_VALIDATION, "name", "somethingElse")
    with Sandbox() as sandbox:
        out = kubectl(sandbox, tmp_path, "apply", "-f", "-", stdin=json.dumps(TYPO))
        assert out.startswith("1\n")
        assert 'unknown field "imagePullPolicyy"' in out and "error validating" in out
        pods = httpx.get(f"{sandbox.url}/api/v1/namespaces/default/pods").json()["items"]
        assert pods == []  # refused by kubectl: the request was never sent
