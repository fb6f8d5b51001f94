"""The harness's kubelet and readiness gates, against the real API server: a pod is Ready only
when its containers are ready and every gate's condition is True, with the kubelet's reasons
and messages (tests/cluster/readiness.py), and the kubelet never overwrites a gate's condition,
which belongs to whoever owns the gate (Snooze writes `snooze.dev/awake`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kube import Kube, wait_for

from .conftest import image

NAMESPACE = "gates"
POD = "gated"
GATES = ("example.com/loaded", "snooze.dev/awake")


@pytest.fixture
def gated(kube: Kube, crds: None) -> Iterator[str]:
    repository, tag = image()
    kube.kubectl("create", "namespace", NAMESPACE, check=False)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": NAMESPACE},
        "spec": {
            "automountServiceAccountToken": False,
            "readinessGates": [{"conditionType": gate} for gate in GATES],
            "containers": [
                {
                    "name": "vllm",
                    "image": f"{repository}:{tag}",
                    "args": ["sim", "--host", "0.0.0.0", "--port", "8000", "--model", "gated"],
                    "readinessProbe": {
                        "httpGet": {"path": "/health", "port": 8000},
                        "periodSeconds": 1,
                    },
                }
            ],
        },
    }
    kube.apply(pod)
    try:
        yield POD
    finally:
        kube.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def conditions(kube: Kube) -> dict[str, dict[str, Any]]:
    pod = kube.get("pod", POD, NAMESPACE)
    return {c["type"]: c for c in pod.get("status", {}).get("conditions") or []}


def set_gate(kube: Kube, gate: str, status: str) -> None:
    """Write a gate's condition as its owner does: a patch of the pod's status."""
    patch = {"status": {"conditions": [{"type": gate, "status": status, "reason": "Test"}]}}
    kube.kubectl("patch", "pod", POD, "-n", NAMESPACE, "--subresource=status",
                 "--type=strategic", "-p", json.dumps(patch))  # fmt: skip


def ready(kube: Kube) -> dict[str, Any]:
    return conditions(kube).get("Ready", {})


def ready_says(kube: Kube, message: str) -> None:
    wait_for(f"Ready to say {message!r}", lambda: ready(kube).get("message") == message)


@pytest.mark.local_only  # it holds the harness's kubelet to the real one's rule
def test_ready_waits_for_every_gate_and_the_containers(kube: Kube, gated: str) -> None:
    wait_for("the container ready", lambda: conditions(kube).get("ContainersReady", {})
             .get("status") == "True", timeout=90)  # fmt: skip
    said = ready(kube)
    assert said["status"] == "False" and said["reason"] == "ReadinessGatesNotReady", said
    assert said["message"] == (
        'corresponding condition of pod readiness gate "example.com/loaded" does not exist., '
        'corresponding condition of pod readiness gate "snooze.dev/awake" does not exist.'
    )

    set_gate(kube, GATES[0], "True")
    ready_says(
        kube, 'corresponding condition of pod readiness gate "snooze.dev/awake" does not exist.'
    )
    assert ready(kube)["status"] == "False"

    set_gate(kube, GATES[1], "False")
    ready_says(kube, 'the status of pod readiness gate "snooze.dev/awake" is not "True", but False')

    set_gate(kube, GATES[1], "True")
    wait_for("Ready", lambda: ready(kube).get("status") == "True")
    now = conditions(kube)
    # A True condition carries no reason: the one the False left is gone.
    assert "reason" not in now["Ready"] and "message" not in now["Ready"], now["Ready"]
    # The kubelet wrote Ready and left the gates' conditions as their owner wrote them.
    for gate in GATES:
        assert now[gate]["status"] == "True" and now[gate]["reason"] == "Test", now[gate]

    # Every gate True is not enough: a container that is not ready makes the pod not Ready.
    pod = kube.core.read_namespaced_pod(POD, NAMESPACE)
    kube.crash(pod)
    wait_for("not Ready while the container restarts",
             lambda: ready(kube).get("reason") == "ContainersNotReady")  # fmt: skip
    assert conditions(kube)["snooze.dev/awake"]["status"] == "True"
    wait_for("Ready again", lambda: ready(kube).get("status") == "True", timeout=90)

    # The owner turns its gate False: not Ready, and the kubelet's next writes keep it False.
    set_gate(kube, GATES[1], "False")
    wait_for("not Ready", lambda: ready(kube).get("status") == "False")
    assert ready(kube)["reason"] == "ReadinessGatesNotReady"
    kube.crash(kube.core.read_namespaced_pod(POD, NAMESPACE))
    wait_for("restarted", lambda: kube.get("pod", POD, NAMESPACE)["status"]
             ["containerStatuses"][0]["restartCount"] == 2, timeout=90)  # fmt: skip
    wait_for("the container ready again", lambda: conditions(kube)["ContainersReady"]
             ["status"] == "True", timeout=90)  # fmt: skip
    after = conditions(kube)
    assert after["snooze.dev/awake"]["status"] == "False", after
    assert after["Ready"]["status"] == "False" and after["Ready"]["reason"] == (
        "ReadinessGatesNotReady"
    ), after
