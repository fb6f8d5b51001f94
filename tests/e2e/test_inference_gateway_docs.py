"""docs/inference-gateway.md, run: its `kubectl apply -f examples/inference-gateway/` as printed,
with the real kubectl against the sandbox (the InferencePool CRD a test-only one of our own);
then what the page says happens, step by step, with the operator as a process: the Deployment's
two pods (made from its template, as its controller would) list the gate and are let into the
pool once their engines answer; idle, they leave it before their drains and sleep; a request
queued at the pool's picker (a stand-in for its metrics port, behind a token) wakes the model
once, and both pods are let back in after their checked wakes."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import docs_pages
import httpx
import pytest
from gated_pods import gate_of, report_running
from picker_stand_in import PickerMetrics, add_picker_pod, install_crd
from processes import Process
from waits import wait_for

from snooze.sim import EngineConfig, SimulatedEngine

from .conftest import PODS, ROOT, Cluster, next_address

pytestmark = pytest.mark.needs("kubectl")

PAGE = "docs/inference-gateway.md"
APPLY = "kubectl apply -f examples/inference-gateway/"
TOKEN = "reader-token"


def test_the_page_prints_this_apply() -> None:
    assert APPLY in docs_pages.commands(docs_pages.read(PAGE))


def start_pod(cluster: Cluster, name: str, template: dict[str, Any]) -> SimulatedEngine:
    """A pod of the Deployment, from its template; its containers ready, and so (gate aside)
    not Ready: the kubelet finds no snooze.dev/awake condition on it yet."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": name, "namespace": "default"},
        "spec": template["spec"],
    }
    cluster.http.post(PODS.format(ns="default"), json=pod).raise_for_status()
    [container] = template["spec"]["containers"]
    host = next_address()
    engine = cluster.sim.add(
        EngineConfig(
            model=container["args"][0],
            host=host,
            port=container["ports"][0]["containerPort"],
            sleep_seconds=0.05,
            wake_seconds=0.05,
            checksum_seconds_per_gib=0.001,
        )
    )
    report_running(cluster, name, host, gated=True)
    return engine


def test_apply_the_examples_and_follow_the_steps(cluster: Cluster, tmp_path: Path) -> None:
    install_crd(cluster)
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.sandbox.write_kubeconfig(tmp_path / "kubeconfig")),
        "KUBECACHEDIR": str(tmp_path / "cache"),
    }
    applied = subprocess.run(
        ["bash", "-c", APPLY], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert applied.returncode == 0, applied.stderr
    for made in (
        "inferencepool.inference.networking.k8s.io/qwen3-8b created",
        "inferencemodel.snooze.dev/qwen3-8b created",
        "deployment.apps/qwen3-8b created",
        "deployment.apps/qwen3-8b-epp created",
        "service/qwen3-8b-epp created",
        "configmap/qwen3-8b-epp created",
    ):
        assert made in applied.stdout, applied.stdout

    # What the controllers would do: the engines' pods, and the picker's endpoint (a stand-in
    # for its metrics port, which asks for the token the operator is given).
    http = httpx.Client(base_url=cluster.sandbox.url, timeout=10)
    deployment = http.get("/apis/apps/v1/namespaces/default/deployments/qwen3-8b").json()
    engines = [
        start_pod(cluster, f"qwen3-8b-{n}", deployment["spec"]["template"])
        for n in range(deployment["spec"]["replicas"])
    ]
    picker = PickerMetrics(next_address(), 9090, token=TOKEN)
    template = http.get("/apis/apps/v1/namespaces/default/deployments/qwen3-8b-epp").json()
    labels = template["spec"]["template"]["metadata"]["labels"]
    add_picker_pod(cluster, "qwen3-8b-epp-0", picker.server.server_address[0], labels=labels)
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "qwen3-8b-epp-x1",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": "qwen3-8b-epp"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "grpc-ext-proc", "port": 9002}, {"name": "http-metrics", "port": 9090}],
        "endpoints": [
            {"addresses": [picker.server.server_address[0]], "conditions": {"ready": True}}
        ],
    }
    http.post("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", json=slice_)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    operator = Process(
        tmp_path / "operator.log",
        "operator",
        "--probe-interval=0.3",
        "--drain-timeout=2",
        "--inference-gateway",
        "--picker-interval=0.2",
        f"--picker-token-file={token}",
    )
    try:
        names = ["qwen3-8b-0", "qwen3-8b-1"]

        def gates() -> list[tuple[str, str] | None]:
            return [gate_of(cluster.pod(name)) for name in names]

        # 1. Each pod is let in once its engine answers (the kubelet then makes it Ready).
        wait_for("both in", lambda: gates() == [("True", "Awake")] * 2, timeout=30)
        assert not any(e.is_sleeping for e in engines)
        # 2. Idle (the example sleeps after ten minutes, here after one second), each leaves
        # the pool before its drain, and sleeps.
        cluster.patch_model("qwen3-8b", {"spec": {"idle": {"after": "1s"}}})
        wait_for("both asleep", lambda: all(e.is_sleeping for e in engines), timeout=30)
        wait_for("both out", lambda: gates() == [("False", "Asleep")] * 2)
        wait_for("the picker read", lambda: cluster.condition("qwen3-8b", "PickerReadable"))
        assert cluster.condition("qwen3-8b", "PickerReadable")["status"] == "True"
        # 3. A request for the model waits in the picker's queue, under its model name.
        picker.queued[("Qwen/Qwen3-8B", "", "0")] = 1
        # 4-6. Snooze reads it, asks for one wake, and lets the pods back in once awake.
        wait_for("both woken", lambda: not any(e.is_sleeping for e in engines), timeout=10)
        wait_for("both in", lambda: gates() == [("True", "Awake")] * 2)
        assert [e.wake_calls for e in engines] == [1, 1]
        [asked] = cluster.events("WakeRequested")
        assert "1 request(s) queued" in asked["message"] and "qwen3-8b" in asked["message"]
        assert picker.asked["no token"] == 0
        picker.queued.clear()  # the picker sent it on
        # A sleep: proves the operator keeps running, for half a second, once the queue empties.
        time.sleep(0.5)
        assert operator.popen.poll() is None
    finally:
        operator.stop()
        picker.stop()
        http.close()
