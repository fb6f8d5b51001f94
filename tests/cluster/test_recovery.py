"""Faults on a real cluster: the operator killed with SIGKILL in the middle of a swap, the
acting replica of two lost (kopf peering hands over), the API server restarted during a wake
(watches come back to a compacted etcd: 410 Gone), and another writer racing the operator on
the same objects. A held request is answered through each, and the state converges."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import helm_python
import httpx
import pytest
from kube import Kube, wait_for

from .conftest import CHART, ENGINES, RELEASE, SYSTEM, release_values
from .test_pools import NAMES, members, oom, phases
from .test_walkthrough import ASK, EXAMPLE, apply_example, engine_states, phase

__all__ = ["members"]
OPERATOR = "app.kubernetes.io/component=operator"


class HeldRequest:
    """A request through the gateway in a thread of its own: the test acts while it is held."""

    def __init__(self, kube: Kube, gateway_pod: Any, model: str) -> None:
        self.url = kube.url(gateway_pod, 8080, "/v1/chat/completions")
        self.http = kube.http(timeout=180)
        self.answer: httpx.Response | None = None
        self.model = model
        self.thread = threading.Thread(target=self._send, daemon=True)
        self.thread.start()

    def _send(self) -> None:
        self.answer = self.http.post(self.url, json={**ASK, "model": self.model})

    def result(self, timeout: float = 180) -> httpx.Response:
        self.thread.join(timeout)
        self.http.close()
        assert self.answer is not None, f"no answer for {self.model} in {timeout:.0f} s"
        return self.answer


def operator_pods(kube: Kube) -> list[Any]:
    return kube.ready_pods(SYSTEM, OPERATOR)


def desired(kube: Kube, state: str) -> None:
    patch = json.dumps({"spec": {"desiredState": state}})
    kube.kubectl("patch", "im", "chat", "-n", ENGINES, "--type=merge", "-p", patch)


@pytest.fixture
def chat(kube: Kube, release: str) -> Iterator[None]:
    """examples/simulated/chat.yaml, asleep: its next request is held while it wakes. Put to
    sleep at once (desiredState: Asleep, then Auto again) rather than after its idle.after:
    the walkthrough proves that part, and each test here would wait for it."""
    apply_example(kube)
    try:
        desired(kube, "Asleep")
        wait_for("chat asleep", lambda: phase(kube) == "Asleep", timeout=120)
        desired(kube, "Auto")
        yield
    finally:
        kube.delete_and_wait(ENGINES, "app.kubernetes.io/name=chat", "-f", str(EXAMPLE))


def test_an_operator_killed_mid_swap_loses_nothing(
    kube: Kube, members: None, gateway_pod: Any
) -> None:
    wait_for(
        "two members awake",
        lambda: sorted(phases(kube).values()) == ["Asleep", "Asleep", "Awake", "Awake"],
        timeout=180,
    )
    operator = operator_pods(kube)[0]
    restarts = operator.status.container_statuses[0].restart_count
    asleep = next(name for name, p in phases(kube).items() if p == "Asleep")
    held = HeldRequest(kube, gateway_pod, asleep)
    # The swap is under way once an awake member drains to make room.
    wait_for(
        "a member draining for the held request",
        lambda: any(
            (pod.metadata.labels or {}).get("snooze.dev/state") == "draining"
            for name in NAMES
            for pod in kube.pods(ENGINES, f"app.kubernetes.io/name={name}")
        ),
        timeout=60,
    )
    kube.crash(operator)
    answer = held.result()
    assert answer.status_code == 200, answer.text
    if kube.local is not None:  # its process was killed and restarted in the same pod
        again = kube.core.read_namespaced_pod(operator.metadata.name, SYSTEM)
        assert again.status.container_statuses[0].restart_count == restarts + 1
    assert oom(kube).get("wake", 0) == 0
    assert list(phases(kube).values()).count("Awake") <= 2


def peering(kube: Kube, names: set[str]) -> list[tuple[str, int]]:
    """The (pod, priority) of each of `names` that keeps its entry in the ClusterKopfPeering."""
    status = kube.get("clusterkopfpeering", RELEASE).get("status") or {}
    peers = [(name, int(entry["priority"])) for name, entry in status.items() if name in names]
    return peers if len(peers) == len(names) else []


def _peering_upgrade(kube: Kube, replicas: int) -> None:
    values = release_values()
    extra = ["--peering-lifetime=6"] if replicas > 1 else []
    values["operator"] |= {"replicas": replicas, "extraArgs": extra}
    with helm_python.Config(kubeconfig_path=str(kube.kubeconfig), namespace=SYSTEM) as helm:
        helm.upgrade(str(CHART), RELEASE, values, namespace=SYSTEM, wait="watcher", timeout=180)


@pytest.mark.local_only  # it upgrades the release
def test_a_standby_operator_takes_over_from_a_lost_one(
    kube: Kube, chat: None, gateway_pod: Any
) -> None:
    _peering_upgrade(kube, replicas=2)
    try:
        pods = wait_for("two operator replicas", lambda: len(operator_pods(kube)) == 2 and
                        operator_pods(kube))  # fmt: skip
        # The acting replica is the live peer of the highest priority; peers are named by
        # their pods (the chart's POD_ID).
        names = {p.metadata.name for p in pods}
        peers = wait_for("both replicas in the peering", lambda: peering(kube, names))
        top = max(peers, key=lambda peer: peer[1])[0]
        acting = [p for p in pods if p.metadata.name == top]
        kube.kubectl("delete", "pod", "-n", SYSTEM, acting[0].metadata.name, "--grace-period=0",
                     "--force")  # fmt: skip
        answer = HeldRequest(kube, gateway_pod, "chat").result()
        assert answer.status_code == 200, answer.text
        assert set(engine_states(kube).values()) == {"awake"}
    finally:
        _peering_upgrade(kube, replicas=1)


@pytest.mark.local_only  # it restarts the API server
def test_the_api_server_restarting_during_a_wake(kube: Kube, chat: None, gateway_pod: Any) -> None:
    assert kube.local is not None and kube.local.control is not None
    operator = operator_pods(kube)[0]
    restarts = operator.status.container_statuses[0].restart_count
    held = HeldRequest(kube, gateway_pod, "chat")
    wait_for(
        "the gateway's wake request",
        lambda: (
            "snooze.dev/wake-requested-at"
            in (kube.get("im", "chat", ENGINES)["metadata"].get("annotations") or {})
        ),
        timeout=30,
    )
    # Down long enough for etcd to compact what the watchers last saw (every 10 s here).
    kube.local.control.restart_apiserver(down_for=12)
    answer = held.result()
    assert answer.status_code == 200, answer.text
    wait_for("chat awake on status", lambda: phase(kube) == "Awake", timeout=120)
    # The watches are back: a model created now is seen and reported on.
    kube.apply(
        {"apiVersion": "snooze.dev/v1alpha1", "kind": "InferenceModel",
         "metadata": {"name": "after-restart", "namespace": ENGINES},
         "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "nothing"}}}}
    )  # fmt: skip
    try:
        wait_for(
            "status for a model made after the restart",
            lambda: kube.get("im", "after-restart", ENGINES).get("status", {}).get("phase"),
            timeout=60,
        )
    finally:
        kube.kubectl("delete", "im", "after-restart", "-n", ENGINES, check=False)
    again = kube.core.read_namespaced_pod(operator.metadata.name, SYSTEM)
    assert again.status.container_statuses[0].restart_count == restarts


def test_another_writer_racing_the_operator_loses_nothing(
    kube: Kube, chat: None, gateway_pod: Any
) -> None:
    """While the model wakes and sleeps, someone else labels and annotates the same model and
    pods as fast as it can: every write of both sides survives (resourceVersion conflicts are
    retried, not lost), and the state ends as it should."""
    stop = threading.Event()
    written: list[str] = []

    def noisy() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            kube.kubectl("annotate", "--overwrite", "-n", ENGINES, "im/chat", f"noise={n}",
                         check=False)  # fmt: skip
            selector = "app.kubernetes.io/name=chat"
            kube.kubectl("label", "--overwrite", "-n", ENGINES, "pods", "-l", selector,
                         f"noise={n}", check=False)  # fmt: skip
            written.append(str(n))

    writer = threading.Thread(target=noisy, daemon=True)
    writer.start()
    try:
        answer = HeldRequest(kube, gateway_pod, "chat").result()
        assert answer.status_code == 200, answer.text
        wait_for("chat asleep again", lambda: phase(kube) == "Asleep", timeout=120)
    finally:
        stop.set()
        writer.join(30)
    last = written[-1]
    model = kube.get("im", "chat", ENGINES)
    assert model["metadata"]["annotations"]["noise"] == last
    assert model["status"]["phase"] == "Asleep" and model["status"]["asleep"] == 2
    for pod in kube.pods(ENGINES, "app.kubernetes.io/name=chat"):
        labels = pod.metadata.labels
        assert labels["noise"] == last and labels["snooze.dev/state"] == "asleep", labels
