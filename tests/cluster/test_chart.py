"""The chart installed with real Helm into a real cluster: the Deployments become available
through the real controllers, the processes run with their service accounts' tokens, and RBAC
refuses what the chart did not grant."""

from __future__ import annotations

from typing import Any

from kube import Kube, wait_for

from .conftest import SYSTEM

OPERATOR_SA = f"system:serviceaccount:{SYSTEM}:snooze-operator"
GATEWAY_SA = f"system:serviceaccount:{SYSTEM}:snooze-gateway"


def can(kube: Kube, who: str, verb: str, resource: str, *extra: str) -> bool:
    done = kube.kubectl("auth", "can-i", verb, resource, f"--as={who}", *extra, check=False)
    return done.stdout.strip() == "yes"


def test_the_deployments_roll_out_through_the_controllers(kube: Kube, release: str) -> None:
    for component in ("operator", "gateway"):
        deployment = kube.get("deployment", f"{release}-{component}", SYSTEM)
        status = deployment["status"]
        assert status.get("availableReplicas") == 1, status
        # A ReplicaSet the controller made owns the pod: garbage collection follows it.
        pods = kube.ready_pods(SYSTEM, f"app.kubernetes.io/component={component}")
        owners = pods[0].metadata.owner_references
        assert owners[0].kind == "ReplicaSet" and owners[0].controller


def test_the_operator_and_gateway_run_as_their_service_accounts(
    kube: Kube, operator_pod: Any, gateway_pod: Any
) -> None:
    assert operator_pod.spec.service_account_name == "snooze-operator"
    assert gateway_pod.spec.service_account_name == "snooze-gateway"
    # The token the runtime mounted is the pod's: the API server's audit of it is its username.
    operator_log = kube.log(operator_pod)
    gateway_log = kube.log(gateway_pod)
    for log in (operator_log, gateway_log):
        assert "Forbidden" not in log and " 403" not in log, log[-3000:]


def test_rbac_refuses_what_the_chart_did_not_grant(kube: Kube, release: str) -> None:
    for who in (OPERATOR_SA, GATEWAY_SA):
        assert not can(kube, who, "get", "secrets", "-A")
        assert not can(kube, who, "list", "secrets", "-n", SYSTEM)
        assert not can(kube, who, "create", "pods", "-n", "llm")
        assert not can(kube, who, "patch", "nodes")
    # The gateway reads models; only the operator writes their status or deletes pods.
    assert can(kube, GATEWAY_SA, "watch", "inferencemodels.snooze.dev", "-A")
    status = ("--subresource=status", "-n", "llm")
    assert not can(kube, GATEWAY_SA, "patch", "inferencemodels.snooze.dev", *status)
    assert not can(kube, GATEWAY_SA, "delete", "pods", "-n", "llm")
    assert can(kube, OPERATOR_SA, "patch", "inferencemodels.snooze.dev", *status)
    assert can(kube, OPERATOR_SA, "delete", "pods", "-n", "llm")


def test_a_token_of_the_operator_cannot_read_secrets(kube: Kube, release: str) -> None:
    """Not only what RBAC says (can-i) but what the API server does with the real token."""
    token = kube.kubectl("create", "token", "snooze-operator", "-n", SYSTEM).stdout.strip()
    done = kube.kubectl_as(token, "get", "secrets", "-A")
    assert done.returncode != 0
    assert "forbidden" in done.stderr.lower(), done.stderr
    assert "snooze-operator" in done.stderr
    # The same token reads what the chart granted.
    assert kube.kubectl_as(token, "get", "inferencemodels.snooze.dev", "-A").returncode == 0


def test_the_gateway_answers_through_its_pod(kube: Kube, gateway_pod: Any) -> None:
    with kube.http() as http:
        answer = wait_for(
            "the gateway's /readyz",
            lambda: http.get(kube.url(gateway_pod, 8080, "/readyz")).status_code == 200,
        )
        assert answer
        models = http.get(kube.url(gateway_pod, 8080, "/v1/models")).json()
        assert models["object"] == "list"
