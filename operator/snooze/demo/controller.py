"""A stand-in for the ReplicaSet controller, which the sandbox does not run: it turns each
Deployment's replica count into Pods, each with a simulated engine at its podIP."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import httpx

from snooze.sim import EngineConfig, SimulatedEngine, SimulatorHost

OWNER = "snooze-test/deployment"


class ReplicaSetStandIn:
    """Keeps `spec.replicas` pods (and engines) per Deployment of one namespace."""

    def __init__(
        self,
        *,
        url: str,
        sim: SimulatorHost,
        addresses: Any,
        namespace: str = "default",
        **engine: Any,
    ) -> None:
        self.http = httpx.Client(base_url=url, timeout=10)
        self.sim = sim
        self.addresses = addresses
        self.ns = namespace
        self.engine_options = engine
        self.engines: dict[str, SimulatedEngine] = {}
        self.created: list[str] = []
        self._names = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replicaset", daemon=True)

    def start(self) -> ReplicaSetStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.http.close()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            deployments = self.http.get(f"/apis/apps/v1/namespaces/{self.ns}/deployments").json()
            for deployment in deployments.get("items", []):
                self._reconcile(deployment)

    def _reconcile(self, deployment: dict[str, Any]) -> None:
        name = deployment["metadata"]["name"]
        want = int(deployment["spec"].get("replicas", 1))
        pods = self.http.get(
            f"/api/v1/namespaces/{self.ns}/pods", params={"labelSelector": f"{OWNER}={name}"}
        ).json()["items"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        for pod in live[want:]:
            pod_name = pod["metadata"]["name"]
            self.http.delete(f"/api/v1/namespaces/{self.ns}/pods/{pod_name}")
            engine = self.engines.pop(pod_name, None)
            if engine is not None:
                self.sim.remove(engine)
        for _ in range(want - len(live)):
            self._create(name, deployment["spec"]["template"]["metadata"]["labels"])

    def _create(self, deployment: str, labels: dict[str, str]) -> None:
        name = f"{deployment}-{next(self._names)}"
        ip = next(self.addresses)
        pod = {
            "metadata": {"name": name, "labels": {**labels, OWNER: deployment}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.26.0"}]},
        }
        self.http.post(f"/api/v1/namespaces/{self.ns}/pods", json=pod).raise_for_status()
        # Scheduled, image pulled, model loading: the engine listens once loaded, then Ready.
        options: dict[str, Any] = {
            "model": "m",
            "sleep_seconds": 0.05,
            "wake_seconds": 0.05,
            "reload_seconds": 0.05,
        }
        options.update(self.engine_options)
        self.engines[name] = self.sim.add(EngineConfig(host=ip, port=8000, **options))
        status = {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        self.http.patch(
            f"/api/v1/namespaces/{self.ns}/pods/{name}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        ).raise_for_status()
        self.created.append(name)


def deployment(name: str, *, replicas: int, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.26.0"}]},
            },
        },
    }
