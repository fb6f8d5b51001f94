"""What the operator's terminal says: one INFO line per action naming the model and the pod,
warnings only for what went wrong, no API chatter, and JSON lines on request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builders import gpu_pool
from processes import Process
from waits import wait_for

from .conftest import Cluster

LABELS = {"app": "chat"}
OPERATOR = ["operator", "--probe-interval", "0.2", "--drain-timeout", "2"]


def gone(cluster: Cluster, name: str) -> bool:
    return (
        cluster.http.get(
            f"/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels/{name}"
        ).status_code
        == 404
    )


def sleep_wake_delete(cluster: Cluster) -> None:
    """A model's whole life: it sleeps when idle, wakes on request, and is deleted."""
    cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "1s"}})
    wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep", timeout=30)
    cluster.request_wake("chat")
    wait_for("awake", lambda: cluster.pod_state("chat-0") == "awake", timeout=30)
    response = cluster.http.delete(
        "/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels/chat"
    )
    assert response.status_code in (200, 202), response.text
    # The finalizer comes off once the operator handed the pods back: promptly, not after
    # a daemon's cancellation timeout.
    wait_for("the model gone", lambda: gone(cluster, "chat"), timeout=15)


def test_each_action_is_one_info_line(cluster: Cluster, tmp_path: Path) -> None:
    operator = Process(tmp_path / "operator.log", *OPERATOR)
    try:
        sleep_wake_delete(cluster)
        cluster.create_model(
            "broken", {"selector": {"matchLabels": LABELS}, "idle": {"after": "0s"}}
        )
        wait_for(
            "the invalid spec told", lambda: "default/broken InvalidSpec:" in operator.output()
        )
    finally:
        assert operator.stop() == 0, operator.output()[-3000:]
    lines = operator.output().splitlines()

    def line(reason: str) -> str:
        found = [entry for entry in lines if f" default/chat {reason}: " in entry]
        assert found, f"no {reason} line in:\n" + "\n".join(lines)
        return found[0]

    for reason in ("Draining", "Slept", "Waking", "Woke", "Released"):
        assert " INFO snooze.operator.events: " in line(reason), line(reason)
    for reason in ("Draining", "Slept", "Waking", "Woke"):
        assert "chat-0" in line(reason)
    invalid = next(entry for entry in lines if "default/broken InvalidSpec:" in entry)
    assert " WARNING " in invalid and "spec.idle.after" in invalid
    # A normal deletion is no warning, and nothing else went wrong.
    warnings = [entry for entry in lines if " WARNING " in entry or " ERROR " in entry]
    assert warnings == [invalid], "\n".join(warnings)
    assert "Traceback" not in operator.output()
    # API and engine requests are debug chatter.
    assert not [entry for entry in lines if "HTTP Request:" in entry or "API GET" in entry]


def test_json_lines_carry_the_model_and_reason(cluster: Cluster, tmp_path: Path) -> None:
    operator = Process(tmp_path / "operator.log", *OPERATOR, "--log-format", "json")
    try:
        sleep_wake_delete(cluster)
    finally:
        assert operator.stop() == 0, operator.output()[-3000:]
    records: list[dict[str, Any]] = [json.loads(entry) for entry in operator.output().splitlines()]
    slept = [r for r in records if r.get("reason") == "Slept"]
    assert slept, records
    assert slept[0]["model"] == "chat" and slept[0]["namespace"] == "default"
    assert slept[0]["severity"] == "info" and "chat-0" in slept[0]["message"]
    assert [r for r in records if r["severity"] not in ("debug", "info")] == []


def test_verbose_shows_the_api_calls(cluster: Cluster, tmp_path: Path) -> None:
    """`-v` shows the engine probes and kopf's debug records; `--verbose` and `--log-level
    debug` are the same flag (tests/unit/test_cli.py)."""
    cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}})
    operator = Process(tmp_path / "operator.log", *OPERATOR, "-v")
    try:
        # The operator's own API calls, and kopf's watch streams.
        wait_for("API calls logged", lambda: "API GET /api" in operator.output())
        wait_for("kopf's debug", lambda: " DEBUG kopf" in operator.output())
    finally:
        operator.stop()


POOLS = "/apis/snooze.dev/v1alpha1/namespaces/default/gpupools"


def test_a_pools_life_is_told_and_its_deletion_warns_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A GPUPool's Events are lines too (its invalid spec a warning, naming the pool); deleting
    it stops its loop at once, with no "cancelled, will escalate" warning from kopf."""
    # A long interval: the pool's loop is waiting out most of it when the pool is deleted.
    operator = Process(
        tmp_path / "operator.log", "operator", "--probe-interval", "30", "--log-format", "json"
    )
    try:
        # The schema takes this memory; the operator refuses it.
        cluster.http.post(POOLS, json=gpu_pool(memory="1e400")).raise_for_status()
        wait_for("the invalid spec told", lambda: '"InvalidSpec"' in operator.output())
        fixed = {"spec": {"memory": "70Gi"}}
        cluster.http.patch(
            f"{POOLS}/gpu-0",
            json=fixed,
            headers={"Content-Type": "application/merge-patch+json"},
        ).raise_for_status()
        wait_for(
            "the pool served",
            lambda: cluster.http.get(f"{POOLS}/gpu-0").json().get("status", {}).get("memoryBytes"),
        )
        deleted = cluster.http.delete(f"{POOLS}/gpu-0")
        assert deleted.status_code in (200, 202), deleted.text
        # kopf's finalizer comes off once its loop has stopped: promptly, not after a backoff.
        wait_for(
            "the pool gone",
            lambda: cluster.http.get(f"{POOLS}/gpu-0").status_code == 404,
            timeout=10,
        )
    finally:
        assert operator.stop() == 0, operator.output()[-3000:]
    records: list[dict[str, Any]] = [json.loads(entry) for entry in operator.output().splitlines()]
    [invalid] = [r for r in records if r.get("reason") == "InvalidSpec"]
    assert invalid["pool"] == "gpu-0" and invalid["namespace"] == "default"
    assert invalid["severity"] == "warn" and "spec.memory" in invalid["message"], invalid
    others = [r for r in records if r["severity"] not in ("debug", "info") and r is not invalid]
    assert not others, others
