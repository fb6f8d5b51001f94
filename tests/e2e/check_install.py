"""Snooze installed in the sandbox as docs/install.md installs it: the objects its `helm install`
makes (rendered by Helm's own install action, tests/chart/test_install_docs.py), applied with
kubectl, and what the cluster's controllers and kubelet would add, which the sandbox has none
of: the operator Deployment's pods, Running and Ready, and the Deployment's status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import docs_pages
import pytest
import yaml
from waits import wait_for

from tests.e2e.conftest import Cluster, next_address

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chart"))

from snooze.operator.embedded import OperatorThread
from snooze.sim import EngineConfig
from tests.chart.test_install_docs import commands, install

ROOT = docs_pages.ROOT
PAGE = ROOT / "docs" / "install.md"
PEERING_CRDS = ROOT / "charts" / "snooze" / "crds" / "kopfpeerings.kopf.dev.yaml"
# The sandbox serves neither prometheus-operator's kinds nor a HorizontalPodAutoscaler's
# metrics: what the chart makes of them is not checked by `snooze check`.
LEFT_OUT = {"ServiceMonitor", "PrometheusRule"}


def page_install(**values: Any) -> tuple[str, list[dict[str, Any]]]:
    """The install page's `helm install`, as printed, with `values` set on top."""
    [words] = [w for w in commands(PAGE, "helm install")]
    namespace, objects = install(words)
    if values:
        extra: list[str] = []
        for key, value in values.items():
            extra += ["--set", f"{key}={value}"]
        namespace, objects = install([*words, *extra])
    return namespace, objects


def kubectl(*args: str, input: str | None = None, cache: Path) -> str:
    env = {**os.environ, "KUBECACHEDIR": str(cache)}
    done = subprocess.run(
        ["kubectl", *args], input=input, capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def apply_release(cluster: Cluster, cache: Path, **values: Any) -> dict[str, Any]:
    """The release's objects in the sandbox (kopf's peering CRDs first, which the chart ships
    in its crds/); its operator Deployment, as applied."""
    namespace, objects = page_install(**values)
    kept = [o for o in objects if o["kind"] not in LEFT_OUT]
    manifests = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}]
    kubectl("apply", "--validate=false", "-f", str(PEERING_CRDS), cache=cache)
    kubectl(
        "apply", "--validate=false", "-f", "-",
        input=yaml.safe_dump_all([*manifests, *kept]), cache=cache,
    )  # fmt: skip
    [deployment] = [
        o for o in kept if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("operator")
    ]
    return deployment


def start_operator_pods(cluster: Cluster, deployment: dict[str, Any], names: list[str]) -> None:
    """The Deployment's pods, as its ReplicaSet and the kubelet would make them: its template,
    Running and Ready; and the Deployment's status, as its controller would write it."""
    meta = deployment["metadata"]
    template = deployment["spec"]["template"]
    for i, name in enumerate(names):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": template["metadata"]["labels"],
            },
            "spec": template["spec"],
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/pods"
        cluster._check(cluster.http.post(path, json=pod))
        status = {
            "phase": "Running",
            "podIP": f"10.1.0.{i + 2}",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        cluster._check(
            cluster.http.patch(
                f"{path}/{name}/status",
                json={"status": status},
                headers={"Content-Type": "application/merge-patch+json"},
            )
        )
    replicas = deployment["spec"]["replicas"]
    status = {"replicas": replicas, "readyReplicas": len(names), "availableReplicas": len(names)}
    cluster._check(
        cluster.http.patch(
            f"/apis/apps/v1/namespaces/{meta['namespace']}/deployments/{meta['name']}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )
    )


ENGINE_POD = "qwen3-8b-6d4f9c7b8-kx2vq"
OPERATOR_POD = "snooze-operator-5d8f7c9b6-q4x2m"
FAST: dict[str, Any] = {
    "sleep_seconds": 0.05,
    "wake_seconds": 0.05,
    "checksum_seconds_per_gib": 0.001,
}


def example(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "examples" / name).read_text()) if d]


def add_engine_pod(cluster: Cluster, name: str = ENGINE_POD, **engine: Any) -> str:
    """A pod of examples/vllm-qwen3-8b.yaml's Deployment (its template: labels, arguments,
    VLLM_SERVER_DEV_MODE), Running and Ready, a simulated engine at its address."""
    [deployment] = [d for d in example("vllm-qwen3-8b.yaml") if d["kind"] == "Deployment"]
    template = deployment["spec"]["template"]
    config = EngineConfig(
        model="Qwen/Qwen3-8B", host=next_address(), port=8000, **{**FAST, **engine}
    )
    cluster.engines[name] = cluster.sim.add(config)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": template["metadata"]["labels"],
        },
        "spec": {**template["spec"], "nodeName": "gpu-node-1"},
    }
    cluster._check(cluster.http.post("/api/v1/namespaces/default/pods", json=pod))
    cluster.set_pod_ready(name, config.host, ready=True)
    return config.host


def apply_model(cluster: Cluster) -> None:
    [model] = example("inferencemodel-level1.yaml")
    cluster.create_model(model["metadata"]["name"], model["spec"])


@pytest.fixture
def installed(cluster: Cluster, tmp_path: Path) -> dict[str, Any]:
    """The install page's release in the sandbox, its operator's pod Ready."""
    deployment = apply_release(cluster, tmp_path / "cache")
    start_operator_pods(cluster, deployment, [OPERATOR_POD])
    return deployment


def settled(cluster: Cluster) -> bool:
    status = cluster.status("qwen3-8b")
    return status.get("awake") == 1 and status.get("engines") == 1


@pytest.fixture
def model_running(cluster: Cluster, installed: dict[str, Any], operator: OperatorThread) -> None:
    """The install page's release, and its example model with its engine awake, as the
    operator (running) reports it."""
    add_engine_pod(cluster)
    apply_model(cluster)
    wait_for("the operator's status", lambda: settled(cluster), timeout=30)
