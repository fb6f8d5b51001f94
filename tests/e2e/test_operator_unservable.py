"""What a user meets when the engines cannot do what Snooze asks: an engine without sleep mode,
and a selector that matches no pod. Each is said once, on status and in an Event, with what
to change; nothing is retried in a loop, and a pod that cannot sleep keeps serving."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry
from waits import wait_for

from snooze.operator.metrics import OperatorMetrics

from .conftest import FAST, Cluster, OperatorThread

LABELS = {"app": "chat"}


def reasons(cluster: Cluster, reason: str) -> list[str]:
    return [e.get("message", "") for e in cluster.events(reason)]


def sleep_failures(registry: CollectorRegistry) -> float:
    labels = {"namespace": "default", "model": "chat", "reason": "SleepModeDisabled"}
    return registry.get_sample_value("snooze_sleep_failures_total", labels) or 0.0


def test_an_engine_without_sleep_mode_is_told_once_and_keeps_serving(
    cluster: Cluster, operator_with_metrics: tuple[OperatorThread, OperatorMetrics]
) -> None:
    _, metrics = operator_with_metrics
    cluster.create_pod("chat-0", labels=LABELS, dev_mode=False)
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "1s"}})

    def told() -> dict[str, str] | None:
        condition = cluster.condition("chat", "SleepFailed")
        return condition if condition and condition["status"] == "True" else None

    condition = wait_for("the SleepFailed condition", told, timeout=20)
    assert condition["reason"] == "SleepModeDisabled"
    assert "--enable-sleep-mode" in condition["message"]
    assert "VLLM_SERVER_DEV_MODE=1" in condition["message"]
    assert "chat-0" in condition["message"]
    # Routable all along: awake, and the model is Awake and Ready.
    wait_for("awake again", lambda: cluster.pod_state("chat-0") == "awake")
    wait_for("phase Awake", lambda: cluster.status("chat").get("phase") == "Awake")
    # Forty probe intervals later (FAST probes every 0.1 s), still one attempt, one Event.
    # A sleep: proves no second attempt or Event for forty probe intervals.
    time.sleep(40 * FAST.probe_interval)
    assert len(reasons(cluster, "SleepFailed")) == 1
    assert len(reasons(cluster, "Draining")) == 1
    assert sleep_failures(metrics.registry) == 1
    assert cluster.pod_state("chat-0") == "awake"
    assert cluster.status("chat")["phase"] == "Awake"

    # A new spec (a new generation) is a new try: once.
    cluster.patch_model("chat", {"spec": {"idle": {"after": "2s"}}})
    wait_for("tried again", lambda: len(reasons(cluster, "SleepFailed")) == 2, timeout=20)
    # A sleep: proves no third attempt for forty probe intervals.
    time.sleep(40 * FAST.probe_interval)
    assert len(reasons(cluster, "SleepFailed")) == 2

    # So is a new pod under the same name, here one whose engine has sleep mode.
    cluster.delete_pod("chat-0")
    wait_for("the pod gone", lambda: cluster.pod("chat-0") is None)
    engine = cluster.create_pod("chat-0", labels=LABELS)
    wait_for("asleep", lambda: engine.is_sleeping and cluster.pod_state("chat-0") == "asleep")
    wait_for("the condition cleared", lambda: told() is None)


def test_a_selector_that_matches_nothing_says_so(
    cluster: Cluster, operator: OperatorThread
) -> None:
    cluster.create_model("chat", {"selector": {"matchLabels": {"app": "typo"}}})

    def ready() -> dict[str, str] | None:
        return cluster.condition("chat", "Ready")

    condition = wait_for("the Ready condition", ready)
    assert condition["status"] == "False" and condition["reason"] == "NoPods"
    assert "app=typo" in condition["message"] and "default" in condition["message"]
    wait_for("an Event", lambda: reasons(cluster, "NoPods"))
    assert "app=typo" in reasons(cluster, "NoPods")[0]
    # A sleep: proves the Event is not repeated for twenty probe intervals.
    time.sleep(20 * FAST.probe_interval)
    assert len(reasons(cluster, "NoPods")) == 1  # said once, not at every probe
    # A pod comes: the model serves, and says so.
    cluster.create_pod("chat-0", labels={"app": "typo"})
    wait_for("Ready", lambda: (ready() or {}).get("status") == "True")
    wait_for("told", lambda: reasons(cluster, "PodsFound"))


def test_a_pod_whose_engine_never_answers_is_named_with_the_url(
    cluster: Cluster, operator: OperatorThread
) -> None:
    # A Ready pod whose address has no engine behind it (nothing listens there).
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "chat-0", "namespace": "default", "labels": LABELS},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.26.0"}]},
    }
    created = cluster.http.post("/api/v1/namespaces/default/pods", json=pod)
    assert created.status_code == 201, created.text
    cluster.set_pod_ready("chat-0", "127.0.0.1", ready=True)
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, "engine": {"port": 9}})

    def entry() -> dict[str, str] | None:
        pods = cluster.status("chat").get("pods") or []
        return pods[0] if pods and pods[0].get("state") == "unreachable" else None

    found = wait_for("the pod unreachable", entry)
    assert "http://127.0.0.1:9" in found["message"]
    ready = cluster.condition("chat", "Ready")
    assert ready is not None and ready["status"] == "False"
    assert ready["reason"] == "EnginesUnreachable"
    wait_for("an Event", lambda: reasons(cluster, "EngineUnreachable"))
    assert "http://127.0.0.1:9" in reasons(cluster, "EngineUnreachable")[0]
