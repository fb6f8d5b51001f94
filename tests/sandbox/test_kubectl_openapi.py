"""kubectl's explain and its validated writes against the sandbox, as against a cluster."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import builders
import httpx
import pytest
import yaml

from snooze.sandbox import Sandbox

pytestmark = pytest.mark.needs("kubectl")

ROOT = Path(__file__).parents[2]
MANIFESTS = [
    ROOT / "crds",
    ROOT / "examples" / "sandbox" / "pods.yaml",
    ROOT / "examples" / "sandbox" / "chat.yaml",
    *sorted((ROOT / "examples").glob("*.yaml")),
]


class Kubectl:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", *args], env=self.env, input=stdin, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip

    def ok(self, *args: str, stdin: str | None = None) -> str:
        result = self(*args, stdin=stdin)
        assert result.returncode == 0, result.stderr
        return result.stdout


@pytest.fixture(scope="module")
def kubectl(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    folder = tmp_path_factory.mktemp("kubectl")
    config = sandbox.write_kubeconfig(folder / "kubeconfig")
    env = {**os.environ, "KUBECONFIG": str(config), "KUBECACHEDIR": str(folder / "cache")}
    run = Kubectl(env)
    for manifest in MANIFESTS:
        # Without --validate=false: kubectl validates against the sandbox's OpenAPI documents.
        run.ok("apply", "-f", str(manifest))
    yield run


# kubectl reads its manifests as text: the builders' objects, as JSON.
def model(name: str, **spec: Any) -> str:
    return json.dumps(builders.model(name, **spec))


def pod(name: str, **container: Any) -> str:
    return json.dumps(builders.pod(builders.CONTAINER | container, name=name))


def test_the_repository_manifests_apply_as_written(kubectl: Kubectl) -> None:
    assert "chat" in kubectl.ok("get", "im", "-o", "name")
    assert kubectl.ok("get", "pods", "chat-0", "-o", "jsonpath={.status.podIP}") == "127.0.0.2"
    # Applying again patches: the same documents, the same validation.
    assert "unchanged" in kubectl.ok("apply", "-f", str(ROOT / "examples" / "sandbox"))


def test_explain_a_custom_resource(kubectl: Kubectl) -> None:
    out = kubectl.ok("explain", "inferencemodel.spec.wake")
    assert "KIND:       InferenceModel" in out and "VERSION:    v1alpha1" in out
    assert "FIELD: wake <Object>" in out
    assert "onRequest\t<boolean>" in out and "onFailure\t<string>" in out
    top = kubectl.ok("explain", "inferencemodels.snooze.dev")
    assert "metadata\t<ObjectMeta>" in top and "spec\t<Object>" in top
    missing = kubectl("explain", "inferencemodel.spec.nosuch")
    assert missing.returncode != 0 and 'field "nosuch" does not exist' in missing.stderr


def test_explain_a_built_in_kind(kubectl: Kubectl) -> None:
    out = kubectl.ok("explain", "pods.spec")
    assert "FIELD: spec <PodSpec>" in out
    assert "containers\t<[]Container> -required-" in out
    assert "<IntOrString>" in kubectl.ok("explain", "deployments.spec.strategy.rollingUpdate")


@pytest.mark.parametrize(
    ("manifest", "refusal"),
    [
        (model("typo", idle={"after": "20s", "afterr": "5s"}),
         'Error from server (BadRequest): error when creating "STDIN": InferenceModel in version'
         ' "v1alpha1" cannot be handled as a InferenceModel: strict decoding error: unknown field'
         ' "spec.idle.afterr"'),
        (model("wrongtype", idle={"after": 20}),
         'The InferenceModel "wrongtype" is invalid: spec.idle.after: Invalid value: "integer":'
         ' spec.idle.after in body must be of type string: "integer"'),
        (model("badlevel", sleep={"level": 3}),
         'The InferenceModel "badlevel" is invalid: spec.sleep.level: Unsupported value: 3:'
         ' supported values: "1", "2"'),
        (pod("typo", imagePullPolicyy="Always"),
         'Error from server (BadRequest): error when creating "STDIN": Pod in version "v1" cannot'
         ' be handled as a Pod: strict decoding error: unknown field'
         ' "spec.containers[0].imagePullPolicyy"'),
        (pod("wrongtype", image=5),
         'Error from server (BadRequest): error when creating "STDIN": Pod in version "v1" cannot'
         ' be handled as a Pod: json: cannot unmarshal number into Go struct field'
         ' Container.spec.containers.image of type string'),
    ],
)  # fmt: skip
def test_kubectl_refuses_what_a_cluster_refuses(
    kubectl: Kubectl, manifest: str, refusal: str
) -> None:
    result = kubectl("apply", "-f", "-", stdin=manifest)
    assert result.returncode == 1
    assert result.stderr.strip() == refusal
    name = json.loads(manifest)["metadata"]["name"]
    assert kubectl("get", json.loads(manifest)["kind"].lower(), name).returncode != 0


def test_warn_and_ignore_store_without_the_unknown_field(kubectl: Kubectl) -> None:
    warned = kubectl("apply", "--validate=warn", "-f", "-", stdin=pod("warned", colour="red"))
    assert warned.returncode == 0
    assert 'Warning: unknown field "spec.containers[0].colour"' in warned.stderr
    ignored = kubectl("apply", "--validate=false", "-f", "-", stdin=pod("ignored", colour="red"))
    assert ignored.returncode == 0 and "Warning" not in ignored.stderr
    for name in ("warned", "ignored"):
        stored = json.loads(kubectl.ok("get", "pod", name, "-o", "json"))
        assert "colour" not in stored["spec"]["containers"][0]  # dropped, as a decoder drops it
        kubectl.ok("delete", "pod", name)


def test_an_update_with_an_unknown_field_is_refused(kubectl: Kubectl) -> None:
    kubectl.ok("apply", "-f", "-", stdin=model("updated"))
    result = kubectl("apply", "-f", "-", stdin=model("updated", colour="red"))
    assert result.returncode == 1
    assert 'strict decoding error: unknown field "spec.colour"' in result.stderr
    assert "colour" not in kubectl.ok("get", "im", "updated", "-o", "json")
    kubectl.ok("delete", "im", "updated")


def test_openapi_documents_are_served_by_hash(sandbox: Sandbox) -> None:
    index = httpx.get(f"{sandbox.url}/openapi/v3").json()["paths"]
    url = index["apis/snooze.dev/v1alpha1"]["serverRelativeURL"]
    doc = httpx.get(f"{sandbox.url}{url}")
    assert doc.status_code == 200 and doc.headers["Cache-Control"] == "public, immutable"
    kinds = [
        s.get("x-kubernetes-group-version-kind")
        for s in doc.json()["components"]["schemas"].values()
    ]
    assert [{"group": "snooze.dev", "version": "v1alpha1", "kind": "InferenceModel"}] in kinds
    stale = httpx.get(f"{sandbox.url}/openapi/v3/apis/snooze.dev/v1alpha1?hash=0")
    assert stale.status_code == 301 and stale.headers["Location"] == url
    again = httpx.get(f"{sandbox.url}{url}", headers={"If-None-Match": doc.headers["ETag"]})
    assert again.status_code == 304
    protobuf = {"Accept": "application/com.github.proto-openapi.spec.v3@v1.0+protobuf"}
    assert httpx.get(f"{sandbox.url}{url}", headers=protobuf).status_code == 406
    assert httpx.get(f"{sandbox.url}/openapi/v3/apis/nosuch.dev/v1").status_code == 404


def test_field_validation_values_are_checked(sandbox: Sandbox) -> None:
    pods = f"{sandbox.url}/api/v1/namespaces/default/pods"
    body = yaml.safe_load(pod("checked"))
    refused = httpx.post(pods, params={"fieldValidation": "Loose"}, json=body)
    assert refused.status_code == 400 and "fieldValidation" in refused.json()["message"]
    # Reads take no fieldValidation; the API server ignores it there.
    assert httpx.get(pods, params={"fieldValidation": "Loose"}).status_code == 200


def test_a_dry_run_is_refused_not_carried_out(kubectl: Kubectl) -> None:
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=pod("dry"))
    assert result.returncode == 1 and "does not do dry runs" in result.stderr
    assert kubectl("get", "pod", "dry").returncode == 1
