"""Two operator replicas with kopf's peering: the active one is killed (SIGKILL) mid-sleep and
mid-wake; the standby takes over within the peering lifetime, sleeps and wakes nothing twice,
and leaves no model draining."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from waits import wait_for

from snooze.sandbox import Sandbox

from .conftest import Cluster

ROOT = Path(__file__).resolve().parents[2]
PEERING_CRDS = ROOT / "charts" / "snooze" / "crds" / "kopfpeerings.kopf.dev.yaml"
# Seconds a replica's keep-alive counts: the bound on a takeover. kopf renews it every 1 to 3 s
# at this lifetime, so an active replica's loop may stall 5 s (a busy 2-core machine) before a
# standby wrongly takes it for dead.
LIFETIME = 8
LABELS = {"app": "chat"}
OPERATOR = [sys.executable, "-m", "snooze.cli", "operator", "--peering", "snooze"]
OPERATOR += ["--probe-interval", "0.2", "--drain-timeout", "2"]


class Replicas:
    """Operator processes with peering, each killable like a crashed pod."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, priority: int) -> None:
        log = (self.log_dir / f"{name}.log").open("wb")
        self.running[name] = subprocess.Popen(
            [*OPERATOR, "--priority", str(priority), "--peering-lifetime", str(LIFETIME)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill(self, name: str) -> float:
        """SIGKILL, as a node failure would: no cleanup, no farewell to the peers."""
        process = self.running.pop(name)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        return time.monotonic()

    def stop_all(self) -> None:
        for process in self.running.values():
            process.terminate()
        for process in self.running.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture
def replicas(sandbox: Sandbox, tmp_path: Path) -> Iterator[Replicas]:
    for crd in yaml.safe_load_all(PEERING_CRDS.read_text()):
        url = f"{sandbox.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        assert httpx.post(url, json=crd).status_code == 201
    peering = {
        "apiVersion": "kopf.dev/v1",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": "snooze"},
    }
    created = httpx.post(f"{sandbox.url}/apis/kopf.dev/v1/clusterkopfpeerings", json=peering)
    assert created.status_code == 201, created.text
    group = Replicas(tmp_path)
    yield group
    group.stop_all()


def active_one(sandbox: Sandbox) -> set[str]:
    body = httpx.get(f"{sandbox.url}/apis/kopf.dev/v1/clusterkopfpeerings/snooze").json()
    return {key for key in (body.get("status") or {})}


def test_the_standby_finishes_what_the_killed_replica_began(
    cluster: Cluster, replicas: Replicas
) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS, sleep_seconds=1.5, wake_seconds=1.0)
    replicas.start("first", priority=200)
    replicas.start("second", priority=100)
    wait_for("both peers seen", lambda: len(active_one(cluster.sandbox)) == 2, timeout=30)
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "1s"}})

    # Killed while the engine frees its memory (its /sleep sent and running).
    wait_for(
        "the sleep sent",
        lambda: (
            "snooze.dev/sleep-sent-at"
            in (cluster.pod("chat-0") or {})["metadata"].get("annotations", {})
        ),
        timeout=30,
    )
    killed = replicas.kill("first")
    wait_for(
        "asleep under the standby",
        lambda: cluster.pod_state("chat-0") == "asleep",
        timeout=LIFETIME + 10,
    )
    assert time.monotonic() - killed < LIFETIME + 10
    wait_for("phase Asleep", lambda: cluster.status("chat").get("phase") == "Asleep", timeout=10)
    assert engine.op_durations["sleep"].count == 1  # slept once, not twice

    # A third replica joins; the active one is killed in the middle of a wake.
    replicas.start("third", priority=50)
    wait_for("three peers seen", lambda: len(active_one(cluster.sandbox)) == 2, timeout=30)
    cluster.patch_model("chat", {"spec": {"idle": {"after": "1h"}}})  # awake, it stays so
    cluster.request_wake("chat")
    wait_for("waking", lambda: cluster.pod_state("chat-0") == "waking", timeout=30)
    replicas.kill("second")
    wait_for(
        "awake under the third",
        lambda: cluster.pod_state("chat-0") == "awake" and not engine.is_sleeping,
        timeout=LIFETIME + 10,
    )
    wait_for("phase Awake", lambda: cluster.status("chat").get("phase") == "Awake", timeout=10)
    assert engine.op_durations["wake"].count == 1  # woken once
    assert engine.op_durations["sleep"].count == 1
