"""Scale to zero on a real cluster: the operator scales a real Deployment through its scale
subresource, the ReplicaSet controller removes the pods (and the runtime stops their
processes), and a request through the gateway brings a new pod up and is answered."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from kube import Kube, wait_for

from .conftest import ENGINES
from .test_walkthrough import ASK, EXAMPLE, image

LABEL = "app.kubernetes.io/name=coder"


def manifests() -> list[dict[str, Any]]:
    """examples/simulated/chat.yaml as a one-replica `coder`, scaled to zero after 8 idle s."""
    deployment, model = yaml.safe_load_all(EXAMPLE.read_text())
    deployment = copy.deepcopy(deployment)
    text = yaml.safe_dump(deployment).replace("chat", "coder")
    deployment = yaml.safe_load(text)
    deployment["spec"]["replicas"] = 1
    repository, tag = image()
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = f"{repository}:{tag}"
    model = yaml.safe_load(yaml.safe_dump(model).replace("chat", "coder"))
    model["spec"]["idle"]["after"] = "3s"
    model["spec"]["scaleToZeroAfter"] = "8s"
    model["spec"]["scaleTargetRef"] = {"kind": "Deployment", "name": "coder"}
    return [deployment, model]


def test_an_idle_model_scales_to_zero_and_a_request_brings_it_back(
    kube: Kube, gateway_pod: Any
) -> None:
    objects = manifests()
    kube.apply(objects, "-n", ENGINES)
    try:
        kube.kubectl("wait", "-n", ENGINES, "im/coder", "--for=jsonpath={.status.phase}=Awake",
                     "--timeout=120s")  # fmt: skip
        first = wait_for("the first pod", lambda: kube.ready_pods(ENGINES, LABEL))[0]
        wait_for(
            "the Deployment at zero replicas",
            lambda: kube.get("deployment", "coder", ENGINES)["spec"]["replicas"] == 0,
            timeout=90,
        )
        wait_for("its pod gone", lambda: not kube.pods(ENGINES, LABEL), timeout=60)
        status = kube.get("im", "coder", ENGINES)["status"]
        assert status["phase"] == "ScaledToZero", status
        assert status["scaledFromReplicas"] == 1

        with kube.http(timeout=180) as http:
            answer = http.post(kube.url(gateway_pod, 8080, "/v1/chat/completions"),
                               json={**ASK, "model": "coder"})  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert kube.get("deployment", "coder", ENGINES)["spec"]["replicas"] == 1
        pods = kube.ready_pods(ENGINES, LABEL)
        assert [p.metadata.name for p in pods] != [first.metadata.name]
        assert pods[0].metadata.owner_references[0].kind == "ReplicaSet"
    finally:
        kube.delete_and_wait(ENGINES, LABEL, "deployment/coder", "im/coder")
