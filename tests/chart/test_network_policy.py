"""The chart's NetworkPolicies for each way of naming the engines and the scraper, judged by who
reaches which port (network_policies.py); and the values it refuses."""

from __future__ import annotations

from typing import Any

import pytest
from network_policies import Pod, reaches
from rendering import VALUE_SETS, Rendering, render, render_error

PROMETHEUS = {"app.kubernetes.io/name": "prometheus"}
ENGINE = {"snooze.dev/engine": "vllm", "app": "qwen"}


def pod_of(rendering: Rendering, component: str) -> Pod:
    deployment = rendering.one("Deployment", f"-{component}")
    return Pod(
        deployment["metadata"]["namespace"], deployment["spec"]["template"]["metadata"]["labels"]
    )


def can(rendering: Rendering, source: Pod, target: Pod, port: int) -> bool:
    return reaches(rendering.of_kind("NetworkPolicy"), source, target, port)


def test_the_scraper_can_be_kept_off_the_engines() -> None:
    """`scraper.engines: false`: Snooze's metrics only, never the engines' port, whose admin
    routes a NetworkPolicy cannot tell from /metrics."""
    scraper = {"namespace": "monitoring"}
    prometheus = Pod("monitoring", PROMETHEUS)
    engine = Pod("models", ENGINE)
    for engines, reached in ((True, True), (False, False)):
        rendering = render(
            {
                "networkPolicy": {
                    "namespaces": ["models"],
                    "scraper": {**scraper, "engines": engines},
                }
            }
        )
        assert can(rendering, prometheus, engine, 8000) is reached
        assert can(rendering, prometheus, pod_of(rendering, "gateway"), 9091)
        assert can(rendering, prometheus, pod_of(rendering, "operator"), 9090)
        assert can(rendering, pod_of(rendering, "operator"), engine, 8000)


def test_a_scraper_named_by_selectors() -> None:
    """ci/monitoring-values.yaml: its namespaces by a label, its pods by another; both must
    match, and it is kept off the engines."""
    rendering = render(VALUE_SETS["monitoring"])
    gateway = pod_of(rendering, "gateway")
    ours = {"team": "observability"}
    prometheus = Pod("obs", {"prometheus": "kube-prometheus-stack-prometheus"}, ours)
    assert can(rendering, prometheus, gateway, 9091)
    assert not can(rendering, Pod("obs", PROMETHEUS, ours), gateway, 9091)
    assert not can(rendering, Pod("tenant", prometheus.labels), gateway, 9091)


def test_the_engines_are_fenced_where_the_operator_watches() -> None:
    """watchNamespaces: a policy in each, unless networkPolicy.namespaces names others."""
    watched = render({"watchNamespaces": ["team-a", "team-b"]})
    where = {p["metadata"]["namespace"] for p in watched.of_kind("NetworkPolicy")}
    assert where == {"team-a", "team-b", "snooze"}
    for namespace in ("team-a", "team-b"):
        assert not can(watched, Pod(namespace, {}), Pod(namespace, ENGINE), 8000)
        assert can(watched, pod_of(watched, "gateway"), Pod(namespace, ENGINE), 8000)
    named = render({"watchNamespaces": ["team-a"], "networkPolicy": {"namespaces": ["gpu"]}})
    assert {p["metadata"]["namespace"] for p in named.of_kind("NetworkPolicy")} == {"gpu", "snooze"}


def test_the_policies_follow_the_ports() -> None:
    rendering = render(
        {
            "gateway": {"port": 8081, "metricsPort": 9999},
            "operator": {"metricsPort": 9191},
            "networkPolicy": {"namespaces": ["models"], "enginePort": 8443},
        }
    )
    gateway, operator = pod_of(rendering, "gateway"), pod_of(rendering, "operator")
    tenant = Pod("models", {})
    assert can(rendering, tenant, gateway, 8081) and not can(rendering, tenant, gateway, 9999)
    assert can(rendering, operator, gateway, 9999)
    assert can(rendering, operator, Pod("models", ENGINE), 8443)
    assert not can(rendering, operator, Pod("models", ENGINE), 8000)


def test_extra_sources_reach_the_engines_only() -> None:
    """ci/namespaced-values.yaml lets a namespace in through extraFrom: on the engines' port."""
    rendering = render(VALUE_SETS["namespaced"])
    visitor = Pod("monitoring", {"any": "pod"})
    assert can(rendering, visitor, Pod("team-a", ENGINE), 8000)
    assert not can(rendering, visitor, pod_of(rendering, "gateway"), 9091)


def test_off_means_no_policy_and_a_warning() -> None:
    rendering = render({"networkPolicy": {"enabled": False}})
    assert rendering.of_kind("NetworkPolicy") == []
    assert "networkPolicy.enabled is false" in rendering.notes


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (
        "a ServiceMonitor no Prometheus may reach",
        {"serviceMonitor": {"enabled": True}},
        "--set networkPolicy.scraper.namespace=monitoring",
    ),
    (
        "a scraper namespace given twice",
        {
            "networkPolicy": {
                "scraper": {
                    "namespace": "monitoring",
                    "namespaceSelector": {"matchLabels": {"team": "obs"}},
                }
            }
        },
        "give namespace or namespaceSelector, not both",
    ),
]


@pytest.mark.parametrize(("case", "values", "says"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused(case: str, values: dict[str, Any], says: str) -> None:
    assert says in render_error(values)


def test_a_service_monitor_with_the_policies_off_needs_no_scraper() -> None:
    values = {"serviceMonitor": {"enabled": True}, "networkPolicy": {"enabled": False}}
    assert render(values).of_kind("ServiceMonitor")
