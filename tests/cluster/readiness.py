"""The kubelet's rule for a Pod's ContainersReady and Ready conditions, readiness gates
included, as Kubernetes v1.34 writes it (pkg/kubelet/status/generate.go,
GenerateContainersReadyCondition and GeneratePodReadyCondition): Ready is True only when every
container is ready and the condition of every gate in spec.readinessGates is there and True.

The kubelet writes these two conditions and no other: a gate's condition belongs to whoever
owns the gate (Snooze writes `snooze.dev/awake`), and a strategic merge patch of these two
leaves it as it is."""

from __future__ import annotations

from typing import Any

CONTAINERS_NOT_READY = "ContainersNotReady"
READINESS_GATES_NOT_READY = "ReadinessGatesNotReady"


def gates_unready(pod: Any) -> list[str]:
    """The kubelet's message for each of the pod's readiness gates that is not True."""
    conditions = {c.type: c.status for c in (pod.status.conditions if pod.status else None) or []}
    messages = []
    for gate in pod.spec.readiness_gates or []:
        kind = gate.condition_type
        if kind not in conditions:
            messages.append(
                f'corresponding condition of pod readiness gate "{kind}" does not exist.'
            )
        elif conditions[kind] != "True":
            messages.append(
                f'the status of pod readiness gate "{kind}" is not "True", but {conditions[kind]}'
            )
    return messages


def conditions(unready_containers: list[str], gates: list[str], now: str) -> list[dict[str, Any]]:
    """ContainersReady and Ready, given the names of the containers that are not ready and the
    messages of the gates that are not True."""
    if unready_containers:
        detail = {
            "reason": CONTAINERS_NOT_READY,
            "message": f"containers with unready status: [{' '.join(unready_containers)}]",
        }
        return [
            {"type": kind, "status": "False", "lastTransitionTime": now, **detail}
            for kind in ("ContainersReady", "Ready")
        ]
    # A True condition has no reason: null removes the one a False one left (strategic merge).
    true = {"status": "True", "lastTransitionTime": now, "reason": None, "message": None}
    ready: dict[str, Any] = {"type": "Ready", **true}
    if gates:
        ready |= {"status": "False", "reason": READINESS_GATES_NOT_READY,
                  "message": ", ".join(gates)}  # fmt: skip
    return [{"type": "ContainersReady", **true}, ready]
