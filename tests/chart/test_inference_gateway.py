"""The chart behind the Gateway API Inference Extension (inferenceGateway), rendered by real Helm:
off by default; on, the operator reads InferencePools, Services and EndpointSlices where it
watches and runs with --inference-gateway, and a ServiceAccount of its own, whose token is
mounted into the operator, may get /metrics and nothing else; the pickers are fenced where
asked. The readiness gate's grant (patch on pods/status) is there either way. Every value set
that turns it on is also validated strictly by test_render.py."""

from __future__ import annotations

from typing import Any

from chart_helpers import plain_defines
from rendering import VALUE_SETS, render

from snooze.api import rbac

READER = "snooze-picker"
TOKEN_DIR = "/var/run/snooze/picker"


def rules_on(role: dict[str, Any], group: str, resource: str) -> list[list[str]]:
    return [
        sorted(rule["verbs"])
        for rule in role["rules"]
        if group in rule.get("apiGroups", []) and resource in rule.get("resources", [])
    ]


def operator_container(rendering: Any) -> dict[str, Any]:
    deployment = rendering.one("Deployment", "-operator")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_off_by_default_but_the_readiness_gate() -> None:
    rendering = render()
    role = rendering.one("ClusterRole", "-operator")
    assert rules_on(role, "", "pods/status") == [["patch"]]
    assert rules_on(role, "inference.networking.k8s.io", "inferencepools") == []
    assert rules_on(role, "", "services") == []
    assert not any(
        rule.get("nonResourceURLs") for r in rendering.of_kind("ClusterRole") for rule in r["rules"]
    )
    assert READER not in {o["metadata"]["name"] for o in rendering.objects}
    assert not any(
        a.startswith(("--inference-gateway", "--picker"))
        for a in operator_container(rendering)["args"]
    )
    assert not [
        p for p in rendering.of_kind("NetworkPolicy") if p["metadata"]["name"].endswith("-pickers")
    ]


def test_on_the_operator_reads_pools_their_services_and_endpoints() -> None:
    rendering = render({"inferenceGateway": {"enabled": True, "pickerInterval": "1s"}})
    role = rendering.one("ClusterRole", "-operator")
    for permission in rbac.INFERENCE_GATEWAY:
        assert rules_on(role, permission.group, permission.resource) == [sorted(permission.verbs)]
    container = operator_container(rendering)
    wanted = [
        "--inference-gateway",
        "--picker-interval=1s",
        f"--picker-token-file={TOKEN_DIR}/token",
    ]
    assert set(wanted) <= set(container["args"])
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == TOKEN_DIR]
    assert mount["readOnly"] is True
    pod = rendering.one("Deployment", "-operator")["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume == {"name": mount["name"], "secret": {"secretName": f"{READER}-token"}}


def test_the_picker_reader_may_get_metrics_and_nothing_else() -> None:
    rendering = render({"inferenceGateway": {"enabled": True}})
    account = rendering.one("ServiceAccount", "-picker")
    assert account["metadata"]["name"] == READER
    assert account["automountServiceAccountToken"] is False
    secret = rendering.one("Secret", "-picker-token")
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": READER}

    role = rendering.one("ClusterRole", "-picker")
    grant = rbac.PICKER_METRICS
    assert role["rules"] == [{"nonResourceURLs": list(grant.urls), "verbs": list(grant.verbs)}]
    assert " ".join(grant.why.split()) in " ".join(
        plain_defines()["snooze.rules.pickerMetrics"].split()
    )
    binding = rendering.one("ClusterRoleBinding", "-picker")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": READER, "namespace": "snooze"}
    ]
    # The reader is bound to that role alone, and the operator's own account is not.
    bound = [
        b
        for b in rendering.of_kind("ClusterRoleBinding") + rendering.of_kind("RoleBinding")
        if any(s["name"] == READER for s in b["subjects"])
    ]
    assert bound == [binding]
    operator_account = rendering.one("Deployment", "-operator")["spec"]["template"]["spec"][
        "serviceAccountName"
    ]
    assert all(s["name"] != operator_account for s in binding["subjects"])


def test_without_rbac_the_token_is_still_made_and_no_role_is() -> None:
    rendering = render({"inferenceGateway": {"enabled": True}, "rbac": {"create": False}})
    assert rendering.one("Secret", "-picker-token")
    assert not rendering.of_kind("ClusterRole") and not rendering.of_kind("ClusterRoleBinding")


def test_watched_namespaces_get_the_rules_and_the_metrics_grant_stays_cluster_wide() -> None:
    rendering = render(VALUE_SETS["namespaced"])
    roles = [r for r in rendering.of_kind("Role") if r["metadata"]["name"].endswith("-operator")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert rules_on(role, "inference.networking.k8s.io", "inferencepools") == [["list"]]
        assert rules_on(role, "discovery.k8s.io", "endpointslices") == [["list"]]
    assert rendering.one("ClusterRole", "-picker")["rules"][0]["nonResourceURLs"] == ["/metrics"]
    assert "--picker-interval=5s" in operator_container(rendering)["args"]


def pickers_policies(rendering: Any) -> list[dict[str, Any]]:
    return [
        p for p in rendering.of_kind("NetworkPolicy") if p["metadata"]["name"].endswith("-pickers")
    ]


def test_the_pickers_are_fenced_where_asked() -> None:
    [policy] = pickers_policies(render(VALUE_SETS["everything"]))
    assert policy["metadata"]["namespace"] == "gateways"
    spec = policy["spec"]
    assert spec["podSelector"] == {
        "matchExpressions": [{"key": "inferencepool", "operator": "Exists"}]
    }
    assert spec["policyTypes"] == ["Ingress"]
    gateway, metrics = spec["ingress"]
    assert gateway == {
        "ports": [{"protocol": "TCP", "port": 9002}, {"protocol": "TCP", "port": 9003}]
    }
    assert metrics["ports"] == [{"protocol": "TCP", "port": 9090}]
    operator, scraper = metrics["from"]
    assert operator["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert operator["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "snooze"}
    }
    assert scraper["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
    }

    [mine] = pickers_policies(render(VALUE_SETS["namespaced"]))
    assert mine["metadata"]["namespace"] == "team-a"
    assert mine["spec"]["podSelector"] == {"matchLabels": {"app": "epp"}}
    assert mine["spec"]["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}}}
    ]


def test_no_picker_is_fenced_unless_the_integration_and_the_policies_are_on() -> None:
    fenced = {"networkPolicy": {"namespaces": ["gateways"]}}
    assert not pickers_policies(render({"inferenceGateway": {**fenced}}))
    on = {"enabled": True, **fenced}
    assert not pickers_policies(
        render({"inferenceGateway": on, "networkPolicy": {"enabled": False}})
    )
    assert pickers_policies(render({"inferenceGateway": on}))
