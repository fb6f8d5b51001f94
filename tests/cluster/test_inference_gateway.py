"""Behind the Inference Gateway, on a real cluster: the real endpoint picker (v1.5.0, flow
control on) reads the pool's pods from the real API server, Envoy's part is played by
extproc-proxy (tests/cluster/picker.py), and the engines' pods carry the readiness gate
`snooze.dev/awake`. The picker sends only to Ready pods, so a pod whose gate is False gets no
request; a request for a model with no Ready pod waits in the picker's queue."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from conftest import ENGINES, image
from kube import Kube, wait_for
from picker import (
    METRICS_PORT,
    PICKER_IMAGE,
    Proxy,
    picker_image,
    picker_manifests,
    pool_crd,
    proxy,
)
from prometheus_client.parser import text_string_to_metric_families

# Its pods are reached at their addresses from the test's side, over gRPC: this cluster's.
pytestmark = pytest.mark.local_only

POOL = "gie"
SELECTOR = {"app.kubernetes.io/name": "gie"}
LABEL = "app.kubernetes.io/name=gie"
GATE = "snooze.dev/awake"


@dataclass
class Gateway:
    """The picker's pod and the stand-in for Envoy in front of it."""

    proxy: Proxy
    picker: Any


@pytest.fixture(scope="module")
def gateway(kube: Kube, release: str) -> Iterator[Gateway]:
    """The InferencePool CRD, the pool `gie` and its picker, and extproc-proxy; started once
    for the module (the picker's start-up is the slow part)."""
    crd = pool_crd()
    kube.kubectl("apply", "-f", str(crd))
    wait_for("the InferencePool CRD established", lambda: any(
        c["type"] == "Established" and c["status"] == "True"
        for c in kube.get("crd", "inferencepools.inference.networking.k8s.io")
        .get("status", {}).get("conditions") or []
    ))  # fmt: skip
    assert kube.local is not None and kube.local.runtime is not None
    kube.local.runtime.images[PICKER_IMAGE] = picker_image()
    objects = picker_manifests(POOL, ENGINES, SELECTOR)
    kube.apply(objects)
    try:
        picker = wait_for("the picker's pod Ready", lambda: kube.ready_pods(
            ENGINES, f"app.kubernetes.io/name={POOL}-epp"), timeout=120)[0]  # fmt: skip
        with proxy(f"{picker.status.pod_ip}:9002") as stand_in:
            yield Gateway(proxy=stand_in, picker=picker)
    finally:
        for item in reversed(objects):
            namespace = item["metadata"].get("namespace")
            kube.kubectl("delete", item["kind"], item["metadata"]["name"], "--ignore-not-found",
                         *(["-n", namespace] if namespace else []), check=False)  # fmt: skip
        kube.kubectl("delete", "-f", str(crd), "--ignore-not-found", check=False)


def engines(replicas: int, *, gated: bool = True) -> dict[str, Any]:
    """A Deployment of simulated engines serving `gie`, their pods gated by Snooze."""
    repository, tag = image()
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "containers": [{
            "name": "vllm",
            "image": f"{repository}:{tag}",
            "args": ["sim", "--host", "0.0.0.0", "--port", "8000", "--model", POOL,
                     "--sleep-seconds", "0.3", "--wake-seconds", "0.3", "--token-seconds", "0"],
            "ports": [{"name": "http", "containerPort": 8000}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": "http"},
                               "periodSeconds": 1},
        }],
    }  # fmt: skip
    if gated:
        spec["readinessGates"] = [{"conditionType": GATE}]
    labels = {**SELECTOR, "snooze.dev/engine": "vllm"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": POOL, "namespace": ENGINES},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": SELECTOR},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def running_pods(kube: Kube) -> list[Any]:
    """The engines' pods whose containers are ready, Ready or not (their gate decides that)."""
    out = []
    for pod in kube.pods(ENGINES, LABEL):
        conditions = {c.type: c.status for c in (pod.status.conditions or [])}
        if pod.metadata.deletion_timestamp is None and conditions.get("ContainersReady") == "True":
            out.append(pod)
    return out


def set_gate(kube: Kube, pod: Any, status: str) -> None:
    body = {"status": {"conditions": [{"type": GATE, "status": status, "reason": "Test"}]}}
    kube.core.patch_namespaced_pod_status(pod.metadata.name, ENGINES, body)


def served(kube: Kube, pod: Any) -> float:
    """The requests the engine says it finished (vllm:request_success_total)."""
    with kube.http() as http:
        page = http.get(kube.url(pod, 8000, "/metrics")).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == "vllm:request_success_total"
    )


def ask(client: httpx.Client, url: str, n: int = 0) -> httpx.Response:
    body = {"model": POOL, "prompt": f"request {n}", "max_tokens": 2}
    return client.post(f"{url}/v1/completions", json=body)


def picker_metrics(kube: Kube, gateway: Gateway, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(timeout=10) as http:
        return http.get(kube.url(gateway.picker, METRICS_PORT, "/metrics"), headers=headers)


def test_a_pod_whose_gate_is_false_gets_no_request(kube: Kube, gateway: Gateway) -> None:
    """The picker and the kubelet's gate rule alone: the test writes the gates."""
    kube.apply(engines(2))
    try:
        pods = wait_for("two engines running", lambda: len(running_pods(kube)) == 2
                        and running_pods(kube), timeout=90)  # fmt: skip
        shut, open_ = pods
        set_gate(kube, shut, "False")
        set_gate(kube, open_, "True")
        wait_for("one pod Ready", lambda: [p.metadata.name for p in kube.ready_pods(
            ENGINES, LABEL)] == [open_.metadata.name])  # fmt: skip
        before = served(kube, shut), served(kube, open_)
        with (
            httpx.Client(timeout=60) as client,
            concurrent.futures.ThreadPoolExecutor(4) as pool,
        ):
            answers = list(pool.map(lambda n: ask(client, gateway.proxy.url, n), range(200)))
        codes = [a.status_code for a in answers]
        assert codes == [200] * 200, (codes, answers[0].text, gateway.proxy.log()[-2000:])
        assert served(kube, shut) == before[0], "a request reached the pod whose gate is False"
        assert served(kube, open_) == before[1] + 200
    finally:
        kube.delete_and_wait(ENGINES, LABEL, f"deployment/{POOL}")


def model(**spec: Any) -> dict[str, Any]:
    """The InferenceModel of the pool's engines: asleep after 2 idle seconds."""
    return {
        "apiVersion": "snooze.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": POOL, "namespace": ENGINES},
        "spec": {
            "modelName": POOL,
            "selector": {"matchLabels": SELECTOR},
            "idle": {"after": "2s"},
            "sleep": {"level": 1},
            **spec,
        },
    }


def gate(pod: Any) -> str:
    """What Snooze's readiness gate says of the pod ('' before it says anything)."""
    conditions = {c.type: c for c in (pod.status.conditions or [])}
    said = conditions.get(GATE)
    return f"{said.status}/{said.reason}" if said is not None else ""


def sleeping(kube: Kube, pod: Any) -> bool:
    with kube.http() as http:
        return bool(http.get(kube.url(pod, 8000, "/is_sleeping")).json()["is_sleeping"])


def test_with_one_of_two_engines_asleep_hundreds_of_requests_never_reach_it(
    kube: Kube, gateway: Gateway
) -> None:
    """Snooze keeps one engine awake (minAwake: 1) and puts the other to sleep; its gate is
    False, so the real picker never sends it a request: its own counter does not move."""
    kube.apply([engines(2), model(minAwake=1)])
    try:

        def split() -> tuple[Any, Any] | None:
            pods = running_pods(kube)
            said = {gate(p): p for p in pods}
            if len(pods) == 2 and set(said) == {"False/Asleep", "True/Awake"}:
                return said["False/Asleep"], said["True/Awake"]
            return None

        asleep, awake = wait_for("one engine asleep, one awake", split, timeout=120)
        assert sleeping(kube, asleep) and not sleeping(kube, awake)
        assert [p.metadata.name for p in kube.ready_pods(ENGINES, LABEL)] == [awake.metadata.name]
        before = served(kube, asleep), served(kube, awake)
        with (
            httpx.Client(timeout=60) as client,
            concurrent.futures.ThreadPoolExecutor(4) as pool,
        ):
            answers = list(pool.map(lambda n: ask(client, gateway.proxy.url, n), range(300)))
        codes = [a.status_code for a in answers]
        assert codes == [200] * 300, (codes, answers[0].text, gateway.proxy.log()[-2000:])
        assert served(kube, asleep) == before[0], "a request reached the sleeping engine"
        assert served(kube, awake) == before[1] + 300
        assert sleeping(kube, asleep), "the sleeping engine was woken"
        [now] = [p for p in running_pods(kube) if p.metadata.name == asleep.metadata.name]
        assert gate(now) == "False/Asleep"
    finally:
        kube.delete_and_wait(ENGINES, LABEL, f"deployment/{POOL}", f"im/{POOL}")
