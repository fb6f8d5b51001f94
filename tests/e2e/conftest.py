"""End-to-end fixtures: a sandbox API server, simulated engines on 127.0.x.y, and the real operator.

Pods are created directly (no controller runs in the sandbox) with `status.podIP` set to the
loopback address where a simulated engine listens, so the operator talks to "pods" exactly as
it would in a cluster.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from gateway_fixtures import gateway  # noqa: F401 (a fixture for every e2e test)

from snooze.operator.embedded import OperatorThread
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.settings import Settings
from snooze.sandbox import Sandbox
from snooze.sim import EngineConfig, SimulatedEngine, SimulatorHost
from snooze.sim.loopback import claim_octet

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "inferencemodels.snooze.dev.yaml"
MODELS = "/apis/snooze.dev/v1alpha1/namespaces/{ns}/inferencemodels"
PODS = "/api/v1/namespaces/{ns}/pods"


# Each engine gets an address of its own, never reused within a run, under an octet claimed
# for this run, so that test runs side by side do not collide.
_OCTET, _CLAIM = claim_octet(range(20, 220))  # the benchmarks claim 127.220 and up
_addresses = (f"127.{_OCTET}.{n // 250}.{n % 250 + 2}" for n in itertools.count())


def next_address() -> str:
    """A loopback address no engine of this run has had: a pod's IP."""
    return next(_addresses)


class Cluster:
    """The sandbox's API as a test uses it: create pods and models, read them back."""

    def __init__(self, sandbox: Sandbox, sim: SimulatorHost, namespace: str = "default") -> None:
        self.sandbox = sandbox
        self.sim = sim
        self.ns = namespace
        self.http = httpx.Client(base_url=sandbox.url, timeout=10)
        self.engines: dict[str, SimulatedEngine] = {}

    def close(self) -> None:
        self.http.close()

    def _check(self, response: httpx.Response) -> dict[str, Any]:
        assert response.status_code < 300, f"{response.status_code}: {response.text}"
        body: dict[str, Any] = response.json()
        return body

    def create_pod(
        self,
        name: str,
        *,
        labels: dict[str, str],
        engine: EngineConfig | None = None,
        ready: bool = True,
        model: str = "m",
        args: list[str] | None = None,
        **engine_options: Any,
    ) -> SimulatedEngine:
        """A Running, Ready pod whose podIP is a simulated engine's address; `args` are its
        container's (`vllm serve` arguments)."""
        config = engine or EngineConfig(
            model=model,
            host=next(_addresses),
            port=8000,
            **{
                "sleep_seconds": 0.05,
                "wake_seconds": 0.05,
                "reload_seconds": 0.05,
                "checksum_seconds_per_gib": 0.001,
                **engine_options,
            },
        )
        sim_engine = self.sim.add(config)
        self.engines[name] = sim_engine
        self.add_pod(name, labels=labels, ip=config.host, ready=ready, args=args)
        return sim_engine

    def add_pod(
        self,
        name: str,
        *,
        labels: dict[str, str],
        ip: str,
        ready: bool = True,
        args: list[str] | None = None,
    ) -> None:
        """A Running pod whose podIP is `ip`, where an engine of the test's own listens; `args`
        are its container's (`vllm serve` arguments)."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.ns, "labels": labels},
            "spec": {
                "containers": [
                    {"name": "vllm", "image": "vllm/vllm-openai:v0.26.0", "args": args or []}
                ]
            },
        }
        self._check(self.http.post(PODS.format(ns=self.ns), json=pod))
        self.set_pod_ready(name, ip, ready=ready)

    def set_pod_ready(self, name: str, ip: str, *, ready: bool) -> None:
        status = {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
        self._check(
            self.http.patch(
                f"{PODS.format(ns=self.ns)}/{name}/status",
                json={"status": status},
                headers={"Content-Type": "application/merge-patch+json"},
            )
        )

    def set_container_restarts(self, name: str, restarts: int) -> None:
        """The kubelet's count of the engine container's restarts (a new count: a new run)."""
        status = {"containerStatuses": [{"name": "vllm", "restartCount": restarts, "ready": True}]}
        self._check(
            self.http.patch(
                f"{PODS.format(ns=self.ns)}/{name}/status",
                json={"status": status},
                headers={"Content-Type": "application/merge-patch+json"},
            )
        )

    def delete_pod(self, name: str) -> None:
        response = self.http.delete(f"{PODS.format(ns=self.ns)}/{name}")
        assert response.status_code in (200, 202, 404), response.text

    def pod(self, name: str) -> dict[str, Any] | None:
        response = self.http.get(f"{PODS.format(ns=self.ns)}/{name}")
        return None if response.status_code == 404 else self._check(response)

    def pod_state(self, name: str) -> str | None:
        pod = self.pod(name)
        if pod is None:
            return None
        labels: dict[str, str] = pod["metadata"].get("labels") or {}
        return labels.get("snooze.dev/state")

    def create_model(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": "snooze.dev/v1alpha1",
            "kind": "InferenceModel",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": spec,
        }
        return self._check(self.http.post(MODELS.format(ns=self.ns), json=body))

    def patch_model(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._check(
            self.http.patch(
                f"{MODELS.format(ns=self.ns)}/{name}",
                json=patch,
                headers={"Content-Type": "application/merge-patch+json"},
            )
        )

    def request_wake(self, name: str, at: float | None = None) -> None:
        from snooze.api.times import format_time

        stamp = format_time(time.time() if at is None else at)
        self.patch_model(
            name, {"metadata": {"annotations": {"snooze.dev/wake-requested-at": stamp}}}
        )

    def model(self, name: str) -> dict[str, Any]:
        return self._check(self.http.get(f"{MODELS.format(ns=self.ns)}/{name}"))

    def status(self, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self.model(name).get("status") or {}
        return status

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        for condition in self.status(name).get("conditions") or []:
            if condition.get("type") == kind:
                return dict(condition)
        return None

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        """Each time an Event was said: an Event said again is one object whose count moves
        (the operator's recorder), listed once per count."""
        return [e for e in self.event_objects(reason) for _ in range(int(e.get("count") or 1))]

    def event_objects(self, reason: str | None = None) -> list[dict[str, Any]]:
        """The Event objects as the API holds them."""
        items: list[dict[str, Any]] = self._check(
            self.http.get(f"/api/v1/namespaces/{self.ns}/events")
        ).get("items", [])
        return [e for e in items if reason is None or e.get("reason") == reason]


FAST = Settings(
    probe_interval=0.1, drift_interval=1.0, drain_timeout=2.0, drain_poll=0.05, probe_timeout=2.0
)


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    with Sandbox() as sb:
        monkeypatch.setenv("KUBECONFIG", str(sb.write_kubeconfig(tmp_path / "kubeconfig")))
        for path in sorted(CRD.parent.glob("*.yaml")):  # what `kubectl apply -f crds/` applies
            crd = yaml.safe_load(path.read_text())
            response = httpx.post(
                f"{sb.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd
            )
            assert response.status_code == 201, response.text
        yield sb


@pytest.fixture
def sim() -> Iterator[SimulatorHost]:
    host = SimulatorHost()
    host.start()
    yield host
    host.stop()


@pytest.fixture
def cluster(sandbox: Sandbox, sim: SimulatorHost) -> Iterator[Cluster]:
    c = Cluster(sandbox, sim)
    yield c
    c.close()


@pytest.fixture
def operator(sandbox: Sandbox) -> Iterator[OperatorThread]:
    thread = OperatorThread(FAST).start()
    yield thread
    thread.stop()


@pytest.fixture
def operator_with_metrics(sandbox: Sandbox) -> Iterator[tuple[OperatorThread, OperatorMetrics]]:
    thread = OperatorThread(FAST).start()
    yield thread, thread.metrics
    thread.stop()
