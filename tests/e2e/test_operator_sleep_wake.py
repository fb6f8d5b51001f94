"""An engine left idle goes to sleep; a wake request brings it back, all of it reported."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from waits import wait_for

from .conftest import Cluster, OperatorThread

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
    # Asleep, it still serves (a request wakes it): Ready, but not Awake.
    assert cluster.condition("chat", "Ready")["status"] == "True"
    assert cluster.condition("chat", "Ready")["reason"] == "AbleToWake"
    assert cluster.condition("chat", "Awake")["status"] == "False"
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
    assert cluster.condition("chat", "Awake")["status"] == "True"
    wait_for("a Woke event", lambda: cluster.events("Woke"))
    assert engine.wake_calls == 1


@pytest.mark.needs("kubectl")
def test_kubectl_wait_for_ready_holds_for_a_sleeping_model(
    cluster: Cluster, operator: OperatorThread, tmp_path: Path
) -> None:
    """`kubectl wait --for=condition=Ready` means "it can serve": a model asleep passes, one
    that nothing can wake does not; `--for=condition=Awake` asks for an awake engine."""
    engine = cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model("chat", SPEC)
    wait_for("asleep", lambda: engine.is_sleeping and cluster.status("chat")["phase"] == "Asleep")

    def kubectl_wait(condition: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "wait", f"--for=condition={condition}", "im/chat", "--timeout=3s"],
            env={**os.environ, "KUBECACHEDIR": str(tmp_path / "cache")},
            capture_output=True,
            text=True,
            timeout=30,
        )

    ready = kubectl_wait("Ready")
    assert ready.returncode == 0, ready.stderr
    assert "condition met" in ready.stdout
    assert kubectl_wait("Awake").returncode != 0  # asleep: no engine awake
    # Told to stay asleep, it cannot serve a request: not Ready.
    cluster.patch_model("chat", {"spec": {"desiredState": "Asleep"}})
    wait_for("Ready False", lambda: cluster.condition("chat", "Ready")["reason"] == "WakeDisabled")
    assert kubectl_wait("Ready").returncode != 0
