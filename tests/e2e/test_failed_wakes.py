"""A wake whose sequence failed never publishes its engine unless the engine's answer was checked
and is as before its sleep: the real operator against simulated engines of the releases where
that happens, asserting on the pod's label and on what the engine saw."""

from __future__ import annotations

import threading
import time

import httpx
from waits import wait_for

from .conftest import FAST, Cluster, OperatorThread
from .test_operator_recovery import started

__all__ = ["started"]
LABELS = {"app": "chat"}


class Labels:
    """Every state label the pod shows, polled until stopped: a pod published awake even for a
    moment is a pod that may have been routed to."""

    def __init__(self, cluster: Cluster, pod: str) -> None:
        self.seen: list[str | None] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(cluster, pod), daemon=True)
        self._thread.start()

    def _poll(self, cluster: Cluster, pod: str) -> None:
        while not self._stop.is_set():
            state = cluster.pod_state(pod) if cluster.pod(pod) is not None else "deleted"
            if not self.seen or self.seen[-1] != state:
                self.seen.append(state)
            time.sleep(0.02)

    def stop(self) -> list[str | None]:
        self._stop.set()
        self._thread.join(5)
        return self.seen


def mark_asleep(cluster: Cluster, pod: str, level: int) -> None:
    """Left as an operator that slept the pod would have."""
    patch = {
        "metadata": {
            "labels": {"snooze.dev/state": "asleep"},
            "annotations": {"snooze.dev/sleep-level": str(level)},
        }
    }
    response = cluster.http.patch(
        f"/api/v1/namespaces/{cluster.ns}/pods/{pod}",
        json=patch,
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code == 200, response.text


def test_a_release_that_wakes_everything_at_the_first_step_is_not_published(
    cluster: Cluster, started: list[OperatorThread]
) -> None:
    """vLLM 0.8.0 to 0.8.2: /wake_up reads no tags, so the first step of a level-2 wake wakes
    the engine on its discarded weights, and the reload that should follow is a 404. The
    engine says it is awake; it answers garbage. (An engine slept at level 2 before Snooze
    refused that level on such releases, or by someone else.)"""
    engine = cluster.create_pod("chat-0", labels=LABELS, vllm_version="0.8.2")
    assert httpx.post(f"{engine.url}/sleep", params={"level": 2}).status_code == 200
    mark_asleep(cluster, "chat-0", level=2)
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, "desiredState": "Awake"})
    labels = Labels(cluster, "chat-0")
    started.append(OperatorThread(FAST).start())
    try:
        wait_for("the pod deleted", lambda: cluster.pod("chat-0") is None, timeout=30)
    finally:
        seen = labels.stop()
    assert "awake" not in seen, seen  # failed, then deleted: too short to be seen every time
    # What the engine saw: the wake's first step woke it whole, the reload had no route.
    assert engine.seen["POST /wake_up"] == 1 and engine.seen["POST /collective_rpc"] == 1
    assert not engine.is_sleeping and not engine.weights_valid
    [event] = wait_for(
        "the WakeFailed Event",
        lambda: [e for e in cluster.events("WakeFailed") if "unchecked" in e["message"]],
    )
    assert "left the engine awake, unchecked" in event["message"]
    assert "/collective_rpc" in event["message"] and "from 0.10.2" in event["message"]
    [restart] = wait_for("the PodRestarted Event", lambda: cluster.events("PodRestarted"))
    assert "chat-0" in restart["message"]


def test_an_engine_that_wakes_after_its_wake_timed_out_is_checked_before_it_serves(
    cluster: Cluster, started: list[OperatorThread]
) -> None:
    """The wake's request times out (wake.timeout), the engine wakes a moment later, answering
    differently than before its sleep: found awake, it is checked, and failed, rather than
    published."""
    engine = cluster.create_pod(
        "chat-0", labels=LABELS, model="chat", wake_seconds=1.4, wake_changes_output=True
    )
    cluster.create_model(
        "chat",
        {
            "selector": {"matchLabels": LABELS},
            "idle": {"after": "1s"},
            "wake": {"timeout": "1s", "onFailure": "Report"},
        },
    )
    started.append(OperatorThread(FAST).start())
    wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep", timeout=30)
    labels = Labels(cluster, "chat-0")
    cluster.patch_model("chat", {"spec": {"desiredState": "Awake"}})
    try:
        wait_for("failed", lambda: cluster.pod_state("chat-0") == "failed", timeout=30)
    finally:
        seen = labels.stop()
    assert "awake" not in seen, seen
    assert not engine.is_sleeping and engine.wake_calls >= 1
    # The operator's greedy requests, and nothing else: no client was routed there.
    assert engine.seen["POST /v1/completions"] == 4  # two at the record, two after the wake
    [event] = wait_for(
        "the WakeFailed Event",
        lambda: [e for e in cluster.events("WakeFailed") if "OutputMismatch" in e["message"]],
    )
    assert "answers differently than before its sleep" in event["message"]


def test_a_partly_woken_engine_of_a_release_before_0_31_is_not_taken_for_awake(
    cluster: Cluster, started: list[OperatorThread]
) -> None:
    """Before 0.31 vLLM records its sleep-state gauge as awake after any wake, of the weights
    alone too. A level-2 wake that crashes at its KV cache (the hybrid-model bug of 0.12 to
    0.26) leaves the engine asleep, /is_sleeping true, while the gauge says awake: the probe
    asks /is_sleeping before it believes the gauge of an engine not published awake, so
    nothing is sent to it, the operator's checks neither."""
    engine = cluster.create_pod(
        "chat-0", labels=LABELS, model="chat", vllm_version="0.24.0", hybrid_wake_crash=True
    )
    cluster.create_model(
        "chat",
        {
            "selector": {"matchLabels": LABELS},
            "idle": {"after": "1s"},
            "sleep": {"level": 2},
            "wake": {"onFailure": "Report"},
        },
    )
    started.append(OperatorThread(FAST).start())
    wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep", timeout=30)
    recorded = engine.seen["POST /v1/completions"]
    labels = Labels(cluster, "chat-0")
    cluster.patch_model("chat", {"spec": {"desiredState": "Awake"}})
    try:
        wait_for("failed", lambda: cluster.pod_state("chat-0") == "failed", timeout=30)
        metrics = httpx.get(f"{engine.url}/metrics/").text
        assert 'sleep_state="awake"} 1.0' in metrics  # what the gauge says
        assert engine.is_sleeping  # what is so
        probes = engine.seen["GET /is_sleeping"]
        wait_for("probes asking /is_sleeping", lambda: engine.seen["GET /is_sleeping"] > probes + 3)
    finally:
        seen = labels.stop()
    assert "awake" not in seen, seen
    assert engine.seen["POST /v1/completions"] == recorded  # no check sent to a sleeping engine


def test_an_engine_woken_from_outside_is_checked_before_it_serves(
    cluster: Cluster, started: list[OperatorThread]
) -> None:
    """Someone with the engine's port wakes it (not the operator): found awake under its
    `asleep` label, it is checked as after the operator's own wake, and answering differently
    it is failed rather than published."""
    engine = cluster.create_pod("chat-0", labels=LABELS, model="chat", wake_changes_output=True)
    spec = {"selector": {"matchLabels": LABELS}, "idle": {"after": "1s"}}
    cluster.create_model("chat", {**spec, "wake": {"onFailure": "Report"}})
    started.append(OperatorThread(FAST).start())
    wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep", timeout=30)
    labels = Labels(cluster, "chat-0")
    try:
        assert httpx.post(f"{engine.url}/wake_up").status_code == 200
        wait_for("failed", lambda: cluster.pod_state("chat-0") == "failed", timeout=30)
    finally:
        seen = labels.stop()
    assert "awake" not in seen, seen
    wait_for(
        "the WakeFailed Event",
        lambda: [e for e in cluster.events("WakeFailed") if "OutputMismatch" in e["message"]],
    )
