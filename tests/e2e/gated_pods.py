"""Pods that list Snooze's readiness gate, as the kubelet reports them (there is none in the
sandbox): Running, their containers ready, and Ready only once every gate's condition is True,
which at first it is not (the snooze.dev/awake condition is not there yet)."""

from __future__ import annotations

from typing import Any

from tests.e2e.conftest import PODS, Cluster

GATE = "snooze.dev/awake"


def report_running(cluster: Cluster, name: str, host: str, *, gated: bool) -> None:
    """The kubelet's status of a pod whose containers are ready, at address `host`."""
    status = {
        "phase": "Running",
        "podIP": host,
        "conditions": [
            {"type": "ContainersReady", "status": "True"},
            {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"}
            if gated
            else {"type": "Ready", "status": "True"},
        ],
    }
    cluster.http.patch(
        f"{PODS.format(ns=cluster.ns)}/{name}/status",
        json={"status": status},
        headers={"Content-Type": "application/merge-patch+json"},
    ).raise_for_status()


def gate_of(pod: dict[str, Any] | None) -> tuple[str, str] | None:
    """The pod's snooze.dev/awake condition: (status, reason), or None if it has none."""
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == GATE:
            return condition["status"], condition.get("reason", "")
    return None
