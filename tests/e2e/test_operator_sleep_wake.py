"""An engine left idle goes to sleep; a wake request brings it back, all of it reported."""

from __future__ import annotations

from conftest import Cluster, OperatorThread, wait_for

LABELS = {"app": "chat"}
SPEC = {"selector": {"matchLabels": LABELS}, "idle": {"after": "1s"}, "sleep": {"level": 1}}


def test_idle_engine_sleeps_and_wakes_on_request(
    cluster: Cluster, operator: OperatorThread
) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model("chat", SPEC)

    wait_for("the pod labelled awake", lambda: cluster.pod_state("chat-0") == "awake")
    wait_for("the engine asleep", lambda: engine.is_sleeping)
    wait_for("the pod labelled asleep", lambda: cluster.pod_state("chat-0") == "asleep")
    status = wait_for(
        "phase Asleep", lambda: (s := cluster.status("chat"))["phase"] == "Asleep" and s
    )
    assert status["asleep"] == 1 and status["awake"] == 0
    assert status["lastSleepTime"]
    assert cluster.condition("chat", "Asleep")["status"] == "True"
    assert cluster.condition("chat", "Ready")["status"] == "False"
    wait_for("a Slept event", lambda: cluster.events("Slept"))
    assert engine.sleep_level == 1

    cluster.request_wake("chat")
    wait_for("the engine awake", lambda: not engine.is_sleeping)
    status = wait_for(
        "phase Awake", lambda: (s := cluster.status("chat"))["phase"] == "Awake" and s
    )
    assert status["lastWakeSeconds"] > 0
    assert status["lastWakeTime"]
    assert cluster.pod_state("chat-0") == "awake"
    assert cluster.condition("chat", "Ready")["status"] == "True"
    wait_for("a Woke event", lambda: cluster.events("Woke"))
    assert engine.wake_calls == 1
