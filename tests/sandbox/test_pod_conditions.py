"""A pod condition written as the operator writes its readiness gate (a strategic merge patch of
pods/status, over HTTP): merged by type as the API server merges it, the kubelet's conditions
and the pod's spec and labels left as they are; a merge patch of the pod itself changes none of
its status."""

from __future__ import annotations

from typing import Any

import httpx

from snooze.sandbox import Sandbox

PODS = "/api/v1/namespaces/default/pods"
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
MERGE = {"Content-Type": "application/merge-patch+json"}


def conditions(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in pod["status"].get("conditions") or []}


def test_one_condition_is_merged_by_type(sandbox: Sandbox) -> None:
    with httpx.Client(base_url=sandbox.url) as http:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gated", "labels": {"app": "chat"}},
            "spec": {
                "containers": [{"name": "vllm", "image": "vllm"}],
                "readinessGates": [{"conditionType": "snooze.dev/awake"}],
            },
        }
        http.post(PODS, json=pod).raise_for_status()
        kubelet = {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [
                {"type": "ContainersReady", "status": "True"},
                {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"},
            ],
        }
        http.patch(f"{PODS}/gated/status", json={"status": kubelet}, headers=MERGE)

        def gate(status: str, reason: str, **more: str) -> dict[str, Any]:
            condition = {"type": "snooze.dev/awake", "status": status, "reason": reason, **more}
            return {"status": {"conditions": [condition]}}

        first = http.patch(
            f"{PODS}/gated/status",
            json=gate("True", "Awake", lastTransitionTime="2026-01-01T00:00:00.000Z"),
            headers=STRATEGIC,
        )
        assert first.status_code == 200, first.text
        found = conditions(first.json())
        assert set(found) == {"ContainersReady", "Ready", "snooze.dev/awake"}
        assert found["Ready"]["reason"] == "ReadinessGatesNotReady"

        # Another value of the same condition: merged into it, field by field (its transition
        # time stays where the patch leaves it out).
        second = http.patch(f"{PODS}/gated/status", json=gate("False", "Asleep"), headers=STRATEGIC)
        found = conditions(second.json())
        assert len(second.json()["status"]["conditions"]) == 3
        assert found["snooze.dev/awake"] == {
            "type": "snooze.dev/awake",
            "status": "False",
            "reason": "Asleep",
            "lastTransitionTime": "2026-01-01T00:00:00.000Z",
        }
        body = second.json()
        assert body["metadata"]["labels"] == {"app": "chat"}
        assert body["spec"]["readinessGates"] == [{"conditionType": "snooze.dev/awake"}]

        # A patch of the pod itself (not /status) leaves its status alone, as the server does.
        main = http.patch(
            f"{PODS}/gated",
            json={"metadata": {"labels": {"x": "y"}}, "status": {"conditions": []}},
            headers=MERGE,
        )
        assert main.status_code == 200, main.text
        assert conditions(main.json()) == found
