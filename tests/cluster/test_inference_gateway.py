"""Behind the Inference Gateway, on a real cluster, as docs/inference-gateway.md sets it up:
examples/inference-gateway/ applied as printed (the InferencePool, and the real endpoint
picker v1.5.0 with flow control on), its vLLM pods with the readiness gate `snooze.dev/awake`
run by the simulator, the chart installed with inferenceGateway.enabled, and Envoy's part
played by extproc-proxy (tests/cluster/picker.py), the one stand-in. The picker sends only to
Ready pods, so an engine Snooze put to sleep gets no request, and a request for a model with
no Ready pod waits in the picker's queue until Snooze, reading that queue, wakes the model."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from kube import Kube, wait_for
from picker import (
    METRICS_PORT,
    PICKER_IMAGE,
    QUEUE_GAUGE,
    Proxy,
    engines_and_model,
    picker_image,
    pool_and_picker,
    pool_crd,
    proxy,
)
from prometheus_client.parser import text_string_to_metric_families

from .conftest import SYSTEM, image

# Its pods are reached at their addresses from the test's side, over gRPC: this cluster's.
pytestmark = pytest.mark.local_only

NAMESPACE = "default"  # the example's
MODEL = "qwen3-8b"
SERVED = "Qwen/Qwen3-8B"
LABEL = "app.kubernetes.io/name=qwen3-8b"
PICKER = "inferencepool=qwen3-8b-epp"
GATE = "snooze.dev/awake"
READER = "snooze-picker"
"""The ServiceAccount whose token the chart gives the operator for the pickers' metrics."""


@dataclass
class Gateway:
    """The picker's pod and the stand-in for Envoy in front of it."""

    proxy: Proxy
    picker: Any


@pytest.fixture(scope="module")
def gateway(kube: Kube, release: str) -> Iterator[Gateway]:
    """The InferencePool CRD (from the picker's module), the example's pool and picker, and
    extproc-proxy; started once for the module (the picker's start-up is the slow part)."""
    crd = pool_crd()
    kube.kubectl("apply", "-f", str(crd))
    wait_for("the InferencePool CRD established", lambda: any(
        c["type"] == "Established" and c["status"] == "True"
        for c in kube.get("crd", "inferencepools.inference.networking.k8s.io")
        .get("status", {}).get("conditions") or []
    ))  # fmt: skip
    assert kube.local is not None and kube.local.runtime is not None
    kube.local.runtime.images[PICKER_IMAGE] = picker_image()
    objects = pool_and_picker()
    kube.apply(objects)
    try:
        picker = wait_for("the picker's pod Ready", lambda: kube.ready_pods(NAMESPACE, PICKER),
                          timeout=120)[0]  # fmt: skip
        with proxy(f"{picker.status.pod_ip}:9002") as stand_in:
            yield Gateway(proxy=stand_in, picker=picker)
    finally:
        for item in reversed(objects):
            namespace = item["metadata"].get("namespace")
            kube.kubectl("delete", item["kind"], item["metadata"]["name"], "--ignore-not-found",
                         *(["-n", namespace] if namespace else []), check=False)  # fmt: skip
        kube.kubectl("delete", "-f", str(crd), "--ignore-not-found", check=False)


def engines(replicas: int, **model_spec: Any) -> list[dict[str, Any]]:
    """The example's engines (simulated) and model, asleep after 2 idle seconds."""
    repository, tag = image()
    fast = ["--sleep-seconds", "0.3", "--wake-seconds", "0.3", "--token-seconds", "0"]
    deployment, model = engines_and_model(f"{repository}:{tag}", fast, replicas)
    model["spec"]["idle"] = {"after": "2s"}
    model["spec"].update(model_spec)
    return [deployment, model]


def remove_engines(kube: Kube) -> None:
    kube.delete_and_wait(NAMESPACE, LABEL, f"deployment/{MODEL}", f"im/{MODEL}")


def running_pods(kube: Kube) -> list[Any]:
    """The engines' pods whose containers are ready, Ready or not (their gate decides that)."""
    out = []
    for pod in kube.pods(NAMESPACE, LABEL):
        conditions = {c.type: c.status for c in (pod.status.conditions or [])}
        if pod.metadata.deletion_timestamp is None and conditions.get("ContainersReady") == "True":
            out.append(pod)
    return out


def gate(pod: Any) -> str:
    """What the readiness gate's condition says of the pod: STATUS/REASON, '' if nothing."""
    conditions = {c.type: c for c in (pod.status.conditions or [])}
    said = conditions.get(GATE)
    return f"{said.status}/{said.reason}" if said is not None else ""


def set_gate(kube: Kube, pod: Any, status: str) -> None:
    body = {"status": {"conditions": [{"type": GATE, "status": status, "reason": "Test"}]}}
    kube.core.patch_namespaced_pod_status(pod.metadata.name, NAMESPACE, body)


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


def sleeping(kube: Kube, pod: Any) -> bool:
    with kube.http() as http:
        return bool(http.get(kube.url(pod, 8000, "/is_sleeping")).json()["is_sleeping"])


def ask(client: httpx.Client, url: str, n: int = 0) -> httpx.Response:
    body = {"model": SERVED, "prompt": f"request {n}", "max_tokens": 2}
    return client.post(f"{url}/v1/completions", json=body)


def ask_many(gateway: Gateway, count: int) -> None:
    """`count` requests through the picker, four at a time; every one answered."""
    with (
        httpx.Client(timeout=60) as client,
        concurrent.futures.ThreadPoolExecutor(4) as pool,
    ):
        answers = list(pool.map(lambda n: ask(client, gateway.proxy.url, n), range(count)))
    codes = [a.status_code for a in answers]
    assert codes == [200] * count, (codes, answers[0].text, gateway.proxy.log()[-2000:])


def picker_metrics(kube: Kube, gateway: Gateway, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(timeout=10) as http:
        return http.get(kube.url(gateway.picker, METRICS_PORT, "/metrics"), headers=headers)


def reader_token(kube: Kube) -> str:
    return kube.kubectl("create", "token", READER, "-n", SYSTEM).stdout.strip()


def queued(kube: Kube, gateway: Gateway, token: str) -> float:
    """The requests the picker holds for the model, from its flow-control gauge."""
    page = picker_metrics(kube, gateway, token).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == QUEUE_GAUGE and sample.labels.get("target_model_name") == SERVED
    )


def test_a_pod_whose_gate_is_false_gets_no_request(kube: Kube, gateway: Gateway) -> None:
    """The picker and the kubelet's gate rule alone: no model, the test writes the gates."""
    [deployment, _] = engines(2)
    kube.apply(deployment)
    try:
        pods = wait_for("two engines running", lambda: len(running_pods(kube)) == 2
                        and running_pods(kube), timeout=90)  # fmt: skip
        shut, open_ = pods
        set_gate(kube, shut, "False")
        set_gate(kube, open_, "True")
        wait_for("one pod Ready", lambda: [p.metadata.name for p in kube.ready_pods(
            NAMESPACE, LABEL)] == [open_.metadata.name])  # fmt: skip
        before = served(kube, shut), served(kube, open_)
        ask_many(gateway, 200)
        assert served(kube, shut) == before[0], "a request reached the pod whose gate is False"
        assert served(kube, open_) == before[1] + 200
    finally:
        remove_engines(kube)


def test_with_one_of_two_engines_asleep_hundreds_of_requests_never_reach_it(
    kube: Kube, gateway: Gateway
) -> None:
    """Snooze keeps one engine awake (minAwake: 1) and puts the other to sleep; its gate is
    False, so the real picker never sends it a request: its own counter does not move."""
    kube.apply(engines(2, minAwake=1))
    try:

        def split() -> tuple[Any, Any] | None:
            pods = running_pods(kube)
            said = {gate(p): p for p in pods}
            if len(pods) == 2 and set(said) == {"False/Asleep", "True/Awake"}:
                return said["False/Asleep"], said["True/Awake"]
            return None

        asleep, awake = wait_for("one engine asleep, one awake", split, timeout=120)
        assert sleeping(kube, asleep) and not sleeping(kube, awake)
        ready = [p.metadata.name for p in kube.ready_pods(NAMESPACE, LABEL)]
        assert ready == [awake.metadata.name]
        before = served(kube, asleep), served(kube, awake)
        ask_many(gateway, 300)
        assert served(kube, asleep) == before[0], "a request reached the sleeping engine"
        assert served(kube, awake) == before[1] + 300
        assert sleeping(kube, asleep), "the sleeping engine was woken"
        [now] = [p for p in running_pods(kube) if p.metadata.name == asleep.metadata.name]
        assert gate(now) == "False/Asleep"
    finally:
        remove_engines(kube)


def test_the_pickers_metrics_refuse_a_request_without_snoozes_token(
    kube: Kube, gateway: Gateway
) -> None:
    """The picker guards /metrics with a TokenReview and a SubjectAccessReview (get on the
    non-resource URL /metrics): no token, a forged one and a ServiceAccount without the grant
    are refused; the token of Snooze's picker reader, whose ServiceAccount the chart binds to
    that grant (inferenceGateway.enabled), reads the queue."""
    assert picker_metrics(kube, gateway, None).status_code == 401
    # controller-runtime's filter (v0.23) answers 500 when the TokenReview calls the token
    # invalid: refused all the same.
    forged = picker_metrics(kube, gateway, "forged.not.a-token")
    assert forged.status_code == 500 and "Authentication failed" in forged.text, forged.text
    for stranger in ("snooze-operator", "snooze-gateway"):
        token = kube.kubectl("create", "token", stranger, "-n", SYSTEM).stdout.strip()
        refused = picker_metrics(kube, gateway, token)
        assert refused.status_code == 403, refused.text
        assert f"system:serviceaccount:{SYSTEM}:{stranger}" in refused.text
    page = picker_metrics(kube, gateway, reader_token(kube))
    assert page.status_code == 200, page.text
    assert "inference_extension_info" in page.text, page.text[:2000]


def test_a_request_held_by_the_picker_wakes_the_model(kube: Kube, gateway: Gateway) -> None:
    """The model asleep, its gate False: the picker has no candidate and holds the request in
    its flow-control queue; Snooze reads the queue, wakes the engine, opens the gate, and the
    picker sends the request there. Snooze is never in the request's path."""
    kube.apply(engines(1))
    try:
        asleep = wait_for("the engine asleep, its gate False", lambda: [
            p for p in running_pods(kube) if gate(p) == "False/Asleep"
        ], timeout=120)[0]  # fmt: skip
        assert sleeping(kube, asleep) and not kube.ready_pods(NAMESPACE, LABEL)
        before = served(kube, asleep)
        token = reader_token(kube)
        with (
            httpx.Client(timeout=120) as client,
            concurrent.futures.ThreadPoolExecutor(1) as pool,
        ):
            held = pool.submit(ask, client, gateway.proxy.url)
            # Held by the picker, not refused: its queue says so while Snooze wakes the model.
            wait_for("the picker's queue holding it", lambda: queued(kube, gateway, token) >= 1,
                     timeout=30)  # fmt: skip
            answer = held.result(timeout=120)
        assert answer.status_code == 200, (answer.text, gateway.proxy.log()[-2000:])
        assert answer.json()["choices"][0]["text"]
        [pod] = running_pods(kube)
        assert pod.metadata.name == asleep.metadata.name, "a new pod, not a wake"
        assert gate(pod) == "True/Awake" and not sleeping(kube, pod)
        # The picker sent it to the woken pod (the engine also counts Snooze's wake checks).
        assert f"-> {pod.status.pod_ip}:8000 200" in gateway.proxy.log().splitlines()[-1]
        assert served(kube, pod) > before
        assert queued(kube, gateway, token) == 0
        events = json.loads(kube.kubectl("events", "-n", NAMESPACE, "--for", f"im/{MODEL}",
                                         "-o", "json").stdout)["items"]  # fmt: skip
        said = {event["reason"]: event["message"] for event in events}
        assert "Waking" in said and "Woke" in said, said
        assert "picker" in said.get("WakeRequested", ""), said
    finally:
        remove_engines(kube)
