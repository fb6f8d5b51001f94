"""A stand-in for the Deployment and ReplicaSet controllers, which the sandbox does not run."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import httpx

from snooze.sim import EngineConfig, SimulatedEngine, SimulatorHost
from snooze.sim.sglang.engine import SGLangConfig

log = logging.getLogger(__name__)
OWNER = "snooze-demo/deployment"
IMAGE = "vllm/vllm-openai:v0.26.0"
NODE = "demo-node"
LOADED_POLL_SECONDS = 0.05


class ReplicaSetStandIn:
    """Keeps `spec.replicas` pods per Deployment of one namespace, each with a simulated engine.

    It plays the node too, as a scheduler and a kubelet would: a pod is created bound to the
    node (`spec.nodeName`), not Ready; its container starts (`container_start`, per
    Deployment), then its engine starts and loads (`startup_seconds`), all in a thread of its
    own so that one slow start never delays another Deployment; it turns Running and Ready
    once the engine has loaded and listens at its podIP. An engine on a shared device
    (`device` in its options) that finds too little memory free answers 503 and retries, as a
    container that exits and restarts would, and its pod stays not Ready until it loads. The
    engine of a deleted pod is killed, as the kubelet would, so a pod the operator deletes
    comes back as a fresh, awake engine.
    """

    def __init__(
        self,
        *,
        url: str,
        sim: SimulatorHost,
        addresses: Iterator[str],
        namespace: str = "default",
        per_deployment: Mapping[str, Mapping[str, Any]] | None = None,
        container_start: Mapping[str, float] | None = None,
        interval: float = 0.05,
        **engine: Any,
    ) -> None:
        self.http = httpx.Client(base_url=url, timeout=10)
        self.sim = sim
        self.addresses = addresses
        self.ns = namespace
        self.engine_options = engine
        self.per_deployment = dict(per_deployment or {})
        self.container_start = dict(container_start or {})
        self.interval = interval
        self.engines: dict[str, SimulatedEngine] = {}
        """Live engines by pod name (read from other threads: replaced, never mutated in place)."""
        self.owners: dict[str, str] = {}
        """Deployment of each pod this controller created."""
        self.created: list[str] = []
        self.every_engine: list[SimulatedEngine] = []
        """Every engine started, those of deleted pods too (their counters stay readable)."""
        self._names = itertools.count()
        self._lock = threading.Lock()
        self._gone: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replicaset", daemon=True)
        self._starters: list[threading.Thread] = []

    def start(self) -> ReplicaSetStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for starter in self._starters:
            starter.join(10)
        self.http.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                deployments = self.http.get(
                    f"/apis/apps/v1/namespaces/{self.ns}/deployments"
                ).json()
                for deployment in deployments.get("items", []):
                    self._reconcile(deployment)
            except httpx.HTTPError as exc:
                # The API server goes first at shutdown; a controller just retries.
                log.debug("replicaset stand-in: %s", exc)

    def _reconcile(self, deployment: dict[str, Any]) -> None:
        name = deployment["metadata"]["name"]
        want = int(deployment["spec"].get("replicas", 1))
        pods = self.http.get(
            f"/api/v1/namespaces/{self.ns}/pods", params={"labelSelector": f"{OWNER}={name}"}
        ).json()["items"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        names = {p["metadata"]["name"] for p in live}
        for pod in live[want:]:
            pod_name = pod["metadata"]["name"]
            self.http.delete(f"/api/v1/namespaces/{self.ns}/pods/{pod_name}")
            names.discard(pod_name)
        with self._lock:
            orphans = [
                pod
                for pod, owner in self.owners.items()
                if owner == name and pod not in names and pod not in self._gone
            ]
            self._gone.update(orphans)
        for pod_name in orphans:
            self._kill(pod_name)
        for _ in range(want - len(live)):
            self._create(name, deployment["spec"]["template"]["metadata"]["labels"])

    def _kill(self, pod: str) -> None:
        with self._lock:
            engine = self.engines.get(pod)
            self.engines = {k: v for k, v in self.engines.items() if k != pod}
        if engine is not None:
            self.sim.remove(engine)

    def _create(self, deployment: str, labels: dict[str, str]) -> None:
        name = f"{deployment}-{next(self._names)}"
        ip = next(self.addresses)
        pod = {
            "metadata": {"name": name, "labels": {**labels, OWNER: deployment}},
            "spec": {"nodeName": NODE, "containers": [{"name": "vllm", "image": IMAGE}]},
        }
        self.http.post(f"/api/v1/namespaces/{self.ns}/pods", json=pod).raise_for_status()
        with self._lock:
            self.owners[name] = deployment
        options: dict[str, Any] = {
            "model": "m",
            "sleep_seconds": 0.05,
            "wake_seconds": 0.05,
            "reload_seconds": 0.05,
            # The weights' digests an engine's first sleep records: quick by default (the
            # demo's scenario gives its engines their own, scaled, cost).
            "checksum_seconds_per_gib": 0.001,
        }
        options.update(self.engine_options)
        options.update(self.per_deployment.get(deployment, {}))
        kind = SGLangConfig if options.pop("engine_kind", "vllm") == "sglang" else EngineConfig
        config = kind(host=ip, port=8000, **options)
        delay = self.container_start.get(deployment, 0.0)
        starter = threading.Thread(
            target=self._load, args=(name, config, delay), name=f"load-{name}", daemon=True
        )
        self._starters = [t for t in self._starters if t.is_alive()] + [starter]
        starter.start()

    def _load(self, name: str, config: EngineConfig, delay: float) -> None:
        # Bound to the node; the container starts, then the engine: it loads (and listens)
        # once its memory is free on its device, and the pod is Ready once it has loaded.
        if self._stop.wait(delay):
            return
        with self._lock:
            if name in self._gone:
                return
        try:
            engine = self.sim.add(config)
        except RuntimeError:
            return  # the simulator stopped while this pod was loading
        with self._lock:
            self.every_engine.append(engine)
            gone = name in self._gone
            if not gone:
                self.engines = {**self.engines, name: engine}
        while not (gone or engine.loaded or self._stop.wait(LOADED_POLL_SECONDS)):
            with self._lock:
                gone = name in self._gone
        if gone or self._stop.is_set():
            self.sim.remove(engine)
            return
        status = {
            "phase": "Running",
            "podIP": config.host,
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        try:
            self.http.patch(
                f"/api/v1/namespaces/{self.ns}/pods/{name}/status",
                json={"status": status},
                headers={"Content-Type": "application/merge-patch+json"},
            ).raise_for_status()
        except httpx.HTTPError as exc:
            log.debug("replicaset stand-in: %s not marked Ready: %s", name, exc)
            return
        self.created.append(name)


def deployment(name: str, *, replicas: int, labels: dict[str, str]) -> dict[str, Any]:
    """A minimal Deployment whose pods carry `labels` (pure)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "vllm", "image": IMAGE}]},
            },
        },
    }
