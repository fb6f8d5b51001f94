"""Rollouts and node drains keep the gateway serving: disruption budgets, a surge-first rolling
update, and a termination grace period that covers the gateway's own shutdown grace."""

from __future__ import annotations

from typing import Any

from rendering import render


def selects(budget: dict[str, Any], deployment: dict[str, Any]) -> bool:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return bool(budget["spec"]["selector"]["matchLabels"].items() <= labels.items())


def test_a_lone_gateway_gets_no_disruption_budget() -> None:
    """One replica: `maxUnavailable: 1` would let a drain evict it anyway, and a budget that
    kept it would block the drain for good: no budget protects a lone pod."""
    assert render().of_kind("PodDisruptionBudget") == []
    one = {"gateway": {"autoscaling": {"enabled": True, "minReplicas": 1}}}
    assert render(one).of_kind("PodDisruptionBudget") == []


def test_two_gateways_or_more_get_a_disruption_budget() -> None:
    """Replicas, or the autoscaler's floor (which it never goes below): a drain then always
    leaves one serving."""
    for values in (
        {"gateway": {"replicas": 2}},
        {"gateway": {"replicas": 1, "autoscaling": {"enabled": True, "minReplicas": 2}}},
    ):
        rendering = render(values)
        [budget] = rendering.of_kind("PodDisruptionBudget")
        assert budget["spec"]["maxUnavailable"] == 1
        assert selects(budget, rendering.one("Deployment", "-gateway"))
        assert not selects(budget, rendering.one("Deployment", "-operator"))
    # The autoscaler decides, whatever gateway.replicas says.
    ignored = {"gateway": {"replicas": 3, "autoscaling": {"enabled": True, "minReplicas": 1}}}
    assert render(ignored).of_kind("PodDisruptionBudget") == []


def test_the_gateway_budget_can_be_a_percentage_or_off() -> None:
    two = {"replicas": 2}
    values = {"gateway": {**two, "podDisruptionBudget": {"maxUnavailable": "50%"}}}
    [budget] = render(values).of_kind("PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == "50%"
    off = {"gateway": {**two, "podDisruptionBudget": {"enabled": False}}}
    assert render(off).of_kind("PodDisruptionBudget") == []


def test_the_operator_has_a_budget_only_with_standbys() -> None:
    """One replica has nothing to keep through a drain (a budget would only block it)."""
    assert render({"operator": {"replicas": 1}}).of_kind("PodDisruptionBudget") == []
    rendering = render({"operator": {"replicas": 3}})
    budget = rendering.one("PodDisruptionBudget", "-operator")
    assert budget["spec"]["maxUnavailable"] == 1
    assert selects(budget, rendering.one("Deployment", "-operator"))
    assert not selects(budget, rendering.one("Deployment", "-gateway"))


def test_gateway_rollouts_start_a_new_pod_before_stopping_one() -> None:
    strategy = render().one("Deployment", "-gateway")["spec"]["strategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }


def test_termination_grace_covers_the_gateways_shutdown_grace() -> None:
    for grace in (30, 120, 1):
        values = {"gateway": {"shutdownGraceSeconds": grace}} if grace != 30 else {}
        spec = render(values).one("Deployment", "-gateway")["spec"]["template"]["spec"]
        assert f"--shutdown-grace-seconds={grace}" in spec["containers"][0]["args"]
        assert spec["terminationGracePeriodSeconds"] == grace + 10


def test_the_operator_reads_the_gateways_counters_through_its_metrics_service() -> None:
    """The operator's --gateway-service names the gateway's metrics Service, whose port is
    named `metrics`, in the release namespace, where a Role lets the operator's service
    account list the Service's EndpointSlices."""
    rendering = render()
    operator = rendering.one("Deployment", "-operator")
    pod = operator["spec"]["template"]["spec"]
    [given] = [a for a in pod["containers"][0]["args"] if a.startswith("--gateway-service=")]
    namespace, name = given.removeprefix("--gateway-service=").split("/")
    service = rendering.one("Service", "-gateway-metrics")
    assert (service["metadata"]["namespace"], service["metadata"]["name"]) == (namespace, name)
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]
    assert selects(
        {"spec": {"selector": {"matchLabels": service["spec"]["selector"]}}},
        rendering.one("Deployment", "-gateway"),
    )
    binding = rendering.one("RoleBinding", "-operator-gateway")
    role = rendering.one("Role", "-operator-gateway")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"] == namespace
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    [subject] = binding["subjects"]
    assert subject["name"] == pod["serviceAccountName"]
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}
    ]


def test_the_operator_strategy_is_given_whole_both_ways() -> None:
    """Peered replicas roll (a new one before an old one stops); one replica is recreated.
    The rolling parameters are the chart's own, not the API server's defaults, so that an
    upgrade back to one replica drops them: Recreate forbids rollingUpdate, and a real API
    server refused that upgrade when the defaults were left in place."""
    peered = render({"operator": {"replicas": 2}}).one("Deployment", "-operator")
    assert peered["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    alone = render().one("Deployment", "-operator")
    assert alone["spec"]["strategy"] == {"type": "Recreate"}


def test_peered_replicas_are_told_apart_by_their_pod_names() -> None:
    """kopf names a peer by POD_ID, else by user and host name, which two replicas can share."""
    spec = render({"operator": {"replicas": 2}}).one("Deployment", "-operator")["spec"]
    [env] = [e for e in spec["template"]["spec"]["containers"][0]["env"] if e["name"] == "POD_ID"]
    assert env["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
