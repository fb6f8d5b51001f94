"""The operator end to end: overrides, level 2, failures, restarts, API faults, bad specs, churn."""

from __future__ import annotations

import time

import httpx
from waits import wait_for

from snooze.sim.engine import GARBAGE_MARKER

from .conftest import FAST, Cluster, OperatorThread

LABELS = {"app": "chat"}


def spec(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {"selector": {"matchLabels": LABELS}, "idle": {"after": "1h"}}
    base.update(overrides)
    return base


def completion(engine_url: str) -> str:
    response = httpx.post(
        f"{engine_url}/v1/completions",
        json={"model": "m", "prompt": "hi", "max_tokens": 4},
        timeout=10,
    )
    response.raise_for_status()
    text: str = response.json()["choices"][0]["text"]
    return text


def test_desired_state_overrides_both_ways(cluster: Cluster, operator: OperatorThread) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model("chat", spec(desiredState="Asleep"))
    wait_for("asleep by override", lambda: engine.is_sleeping)
    wait_for("phase Asleep", lambda: cluster.status("chat").get("phase") == "Asleep")

    # A wake request does not beat desiredState: Asleep.
    cluster.request_wake("chat")
    # A sleep: proves the wake request wakes nothing for half a second (five probes).
    time.sleep(0.5)
    assert engine.is_sleeping

    cluster.patch_model("chat", {"spec": {"desiredState": "Awake", "idle": {"after": "1s"}}})
    wait_for("awake by override", lambda: not engine.is_sleeping)
    wait_for("phase Awake", lambda: cluster.status("chat").get("phase") == "Awake")
    # Idle for longer than idle.after, yet kept awake.
    # A sleep: proves it stays awake for 1.5 s, past idle.after.
    time.sleep(1.5)
    assert not engine.is_sleeping
    assert (
        cluster.status("chat")["observedGeneration"]
        == cluster.model("chat")["metadata"]["generation"]
    )


def test_level_two_wakes_with_reloaded_weights(cluster: Cluster, operator: OperatorThread) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model("chat", spec(idle={"after": "1s"}, sleep={"level": 2}))
    wait_for("asleep at level 2", lambda: engine.is_sleeping and engine.sleep_level == 2)
    cluster.request_wake("chat")
    wait_for("awake", lambda: cluster.pod_state("chat-0") == "awake" and not engine.is_sleeping)
    assert GARBAGE_MARKER not in completion(engine.url)


def test_hybrid_crash_is_reported_then_restarted(
    cluster: Cluster, operator: OperatorThread
) -> None:
    engine = cluster.create_pod("hybrid-0", labels=LABELS, hybrid_wake_crash=True)
    cluster.create_model(
        "chat", spec(idle={"after": "1s"}, wake={"onFailure": "Restart", "failureThreshold": 3})
    )
    wait_for("asleep", lambda: engine.is_sleeping and cluster.pod_state("hybrid-0") == "asleep")
    cluster.request_wake("chat")
    failed = wait_for(
        "WakeFailed",
        lambda: (c := cluster.condition("chat", "WakeFailed")) and c["status"] == "True" and c,
    )
    assert failed["reason"] == "HybridKVCacheReinit"
    assert "0.27.0" in failed["message"] or "images/vllm" in failed["message"]
    # Not retried: only a restart recovers it, whatever failureThreshold says.
    wait_for("the pod deleted", lambda: cluster.pod("hybrid-0") is None)
    assert engine.wake_calls == 1
    wait_for("a PodRestarted event", lambda: cluster.events("PodRestarted"))
    wait_for("a WakeFailed event", lambda: cluster.events("WakeFailed"))
    # Its controller recreates it under the same name (a StatefulSet's pod): a new engine,
    # which inherits none of the old one's failures and wakes as any other.
    fresh = cluster.create_pod("hybrid-0", labels=LABELS)
    wait_for("the new pod asleep", lambda: cluster.pod_state("hybrid-0") == "asleep")
    cluster.request_wake("chat")
    wait_for("the new pod awake", lambda: cluster.pod_state("hybrid-0") == "awake")
    assert fresh.wake_calls == 1
    assert len(cluster.events("PodRestarted")) == 1  # each time it was said


def test_hybrid_crash_with_report_marks_failed(cluster: Cluster, operator: OperatorThread) -> None:
    engine = cluster.create_pod("hybrid-0", labels=LABELS, hybrid_wake_crash=True)
    cluster.create_model("chat", spec(idle={"after": "1s"}, wake={"onFailure": "Report"}))
    wait_for("asleep", lambda: cluster.pod_state("hybrid-0") == "asleep")
    cluster.request_wake("chat")
    wait_for("labelled failed", lambda: cluster.pod_state("hybrid-0") == "failed")
    wait_for("phase Degraded", lambda: cluster.status("chat").get("phase") == "Degraded")
    assert cluster.pod("hybrid-0") is not None
    # A sleep: proves the failed engine is not woken again for half a second.
    time.sleep(0.5)
    assert engine.wake_calls == 1


def test_operator_killed_mid_wake_converges(cluster: Cluster, sandbox: object) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS, wake_seconds=1.0)
    cluster.create_model("chat", spec(idle={"after": "1s"}))
    first = OperatorThread(FAST).start()
    try:
        wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep")
        cluster.request_wake("chat")
        wait_for("waking", lambda: cluster.pod_state("chat-0") == "waking")
    finally:
        first.stop()
    second = OperatorThread(FAST).start()
    try:
        wait_for("awake", lambda: cluster.pod_state("chat-0") == "awake" and not engine.is_sleeping)
        wait_for("phase Awake", lambda: cluster.status("chat").get("phase") == "Awake")
        # No second sleep: it stays awake for its fresh idle period.
        assert engine.sleep_calls == 1
    finally:
        second.stop()


def test_operator_killed_mid_drain_converges(cluster: Cluster, sandbox: object) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS, sleep_seconds=1.0)
    cluster.create_model("chat", spec(idle={"after": "1s"}))
    first = OperatorThread(FAST).start()
    try:
        wait_for("draining", lambda: cluster.pod_state("chat-0") == "draining")
    finally:
        first.stop()
    second = OperatorThread(FAST).start()
    try:
        wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep" and engine.is_sleeping)
        # Slept once. (A /sleep marked sent whose request the first operator never finished
        # sending is sent again; the engine ignores one that reaches it asleep.)
        assert engine.op_durations["sleep"].count == 1
    finally:
        second.stop()


def test_api_conflicts_and_errors_are_retried(cluster: Cluster, operator: OperatorThread) -> None:
    sandbox = cluster.sandbox
    engine = cluster.create_pod("chat-0", labels=LABELS)
    sandbox.inject_fault(method="PATCH", path_contains="/status", status=409, times=2)
    sandbox.inject_fault(method="PATCH", path_contains="/pods/", status=500, times=2)
    cluster.create_model("chat", spec(idle={"after": "1s"}))
    wait_for("asleep despite faults", lambda: cluster.pod_state("chat-0") == "asleep")
    wait_for("phase Asleep", lambda: cluster.status("chat").get("phase") == "Asleep")
    assert engine.is_sleeping


def test_invalid_spec_is_reported_then_recovers(cluster: Cluster, operator: OperatorThread) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS)
    # Past the schema (the pattern allows it), refused by the models: zero is not a duration.
    cluster.create_model("chat", spec(idle={"after": "0s"}))
    condition = wait_for(
        "SpecValid False",
        lambda: (c := cluster.condition("chat", "SpecValid")) and c["status"] == "False" and c,
    )
    assert "spec.idle.after" in condition["message"]
    assert cluster.status("chat")["phase"] == "Invalid"
    wait_for("an InvalidSpec event", lambda: cluster.events("InvalidSpec"))
    # A sleep: proves an invalid spec sleeps and labels nothing for half a second.
    time.sleep(0.5)
    assert not engine.is_sleeping and cluster.pod_state("chat-0") is None

    cluster.patch_model("chat", {"spec": {"idle": {"after": "1s"}}})
    wait_for("asleep once fixed", lambda: engine.is_sleeping)
    wait_for(
        "SpecValid True",
        lambda: (c := cluster.condition("chat", "SpecValid")) and c["status"] == "True",
    )


def test_pods_added_and_removed(cluster: Cluster, operator: OperatorThread) -> None:
    first = cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model("chat", spec(idle={"after": "1s"}))
    wait_for("one asleep", lambda: first.is_sleeping)
    second = cluster.create_pod("chat-1", labels=LABELS)
    wait_for(
        "the new pod labelled",
        lambda: cluster.pod_state("chat-1") in ("awake", "draining", "asleep"),
    )
    wait_for("two asleep", lambda: cluster.status("chat").get("asleep") == 2)
    assert second.is_sleeping
    cluster.delete_pod("chat-0")
    wait_for("one engine left", lambda: cluster.status("chat").get("engines") == 1)
    assert [p["name"] for p in cluster.status("chat")["pods"]] == ["chat-1"]


def test_min_awake_keeps_engines_up(cluster: Cluster, operator: OperatorThread) -> None:
    engines = [cluster.create_pod(f"chat-{i}", labels=LABELS) for i in range(3)]
    cluster.create_model("chat", spec(idle={"after": "1s"}, minAwake=1))
    wait_for("two asleep", lambda: sum(e.is_sleeping for e in engines) == 2)
    # A sleep: proves minAwake keeps the third awake for half a second more.
    time.sleep(0.5)
    assert sum(e.is_sleeping for e in engines) == 2
    assert cluster.status("chat")["awake"] == 1


def test_unready_pod_is_never_slept(cluster: Cluster, operator: OperatorThread) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS, ready=False)
    cluster.create_model("chat", spec(idle={"after": "1s"}))
    wait_for("status written", lambda: cluster.status("chat").get("engines") == 1)
    # A sleep: proves an unready pod is not slept for 1.5 s, past idle.after.
    time.sleep(1.5)
    assert not engine.is_sleeping
    assert cluster.status("chat")["pods"][0]["state"] == "unready"


def test_busy_engine_is_not_slept(cluster: Cluster, operator: OperatorThread) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS, token_seconds=0.05)
    cluster.create_model("chat", spec(idle={"after": "1s"}))
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        completion(engine.url)  # each takes a moment: the engine is never idle for a second
    assert not engine.is_sleeping
    wait_for("asleep once traffic stops", lambda: engine.is_sleeping)


def test_deleting_a_model_hands_its_pods_back_awake(
    cluster: Cluster, operator: OperatorThread
) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model("chat", spec(idle={"after": "1s"}, sleep={"level": 2}))
    wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep" and engine.is_sleeping)
    response = cluster.http.delete(
        "/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels/chat"
    )
    assert response.status_code in (200, 202)
    wait_for(
        "the model gone",
        lambda: (
            cluster.http.get(
                "/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels/chat"
            ).status_code
            == 404
        ),
    )
    assert not engine.is_sleeping
    pod = cluster.pod("chat-0")
    assert pod is not None
    assert "snooze.dev/state" not in (pod["metadata"].get("labels") or {})
    assert "snooze.dev/sleep-started-at" not in (pod["metadata"].get("annotations") or {})
    assert GARBAGE_MARKER not in completion(engine.url)


def test_a_model_deleted_while_the_operator_is_down_is_handed_back_when_it_starts(
    cluster: Cluster, sandbox: object
) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model("chat", spec(idle={"after": "1s"}))
    first = OperatorThread(FAST).start()
    try:
        wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep" and engine.is_sleeping)
    finally:
        first.stop()
    url = "/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels/chat"
    assert cluster.http.delete(url).status_code in (200, 202)
    # Its finalizer holds it until an operator hands its engines back.
    # A sleep: proves the finalizer holds the model for half a second.
    time.sleep(0.5)
    assert cluster.http.get(url).status_code == 200
    assert engine.is_sleeping
    second = OperatorThread(FAST).start()
    try:
        wait_for("the model gone", lambda: cluster.http.get(url).status_code == 404)
        assert not engine.is_sleeping
        pod = cluster.pod("chat-0")
        assert pod is not None and "snooze.dev/state" not in (pod["metadata"].get("labels") or {})
    finally:
        second.stop()
