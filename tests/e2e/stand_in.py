"""The test plays the operator: it writes pod labels and a model's status exactly as the
operator would (through the sandbox API, the status subresource), for gateway tests whose
engines the operator cannot probe or whose status the operator does not write yet (the
`Conflict` condition of a model name taken by another model)."""

from __future__ import annotations

from typing import Any

from tests.e2e.conftest import MODELS, PODS, Cluster


def set_label(cluster: Cluster, pod: str, state: str) -> None:
    """Label a pod `snooze.dev/state: state`, as the operator (or a pod's owner) would."""
    cluster._check(
        cluster.http.patch(
            f"{PODS.format(ns=cluster.ns)}/{pod}",
            json={"metadata": {"labels": {"snooze.dev/state": state}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
    )


def pod_uid(cluster: Cluster, pod: str) -> str:
    body = cluster.pod(pod)
    assert body is not None, f"no pod {pod}"
    return str(body["metadata"]["uid"])


def write_status(
    cluster: Cluster,
    model: str,
    *,
    model_name: str,
    pods: dict[str, str],
    uids: bool = True,
    conditions: list[dict[str, Any]] | None = None,
) -> None:
    """The status the operator writes: the name it routes by, each pod's state (with the pod's
    uid when `uids`), and conditions."""
    entries = []
    for name, state in pods.items():
        entry = {"name": name, "state": state}
        if uids:
            entry["uid"] = pod_uid(cluster, name)
        entries.append(entry)
    awake = sum(1 for state in pods.values() if state == "awake")
    status = {
        "phase": "Awake" if awake else "Asleep",
        "modelName": model_name,
        "engines": len(pods),
        "awake": awake,
        "pods": entries,
        "conditions": conditions or [],
    }
    cluster._check(
        cluster.http.patch(
            f"{MODELS.format(ns=cluster.ns)}/{model}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )
    )


def conflict(holder_hint: str) -> dict[str, Any]:
    """The condition the operator sets on a model whose model name another model holds."""
    return {
        "type": "Conflict",
        "status": "True",
        "reason": "ModelNameTaken",
        "message": f"the model name is held by {holder_hint}",
        "lastTransitionTime": "2026-01-01T00:00:00.000Z",
    }


def no_conflict() -> dict[str, Any]:
    return {
        "type": "Conflict",
        "status": "False",
        "reason": "ModelNameHeld",
        "message": "this model holds its model name",
        "lastTransitionTime": "2026-01-01T00:00:00.000Z",
    }
