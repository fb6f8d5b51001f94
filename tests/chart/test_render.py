"""The chart rendered by real Helm, for every value set: `helm lint --strict` passes, every object
validates strictly for every Kubernetes version the chart claims, names fit, rules load."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from chart_helpers import CHART, CRDS, load_yaml
from rendering import (
    CI_VALUES,
    VALUE_SETS,
    Rendering,
    kube_versions,
    lint,
    name_problems,
    render,
    validate,
    validate_builtin,
)

SETS = sorted(VALUE_SETS)
# What a value set must turn on to count as "every optional feature".
OPTIONAL_KINDS = {
    "ServiceMonitor",
    "PrometheusRule",
    "NetworkPolicy",
    "HorizontalPodAutoscaler",
    "PodDisruptionBudget",
    "ConfigMap",
    "ClusterKopfPeering",
}


def test_one_value_set_turns_on_every_optional_feature() -> None:
    everything = render(VALUE_SETS["everything"])
    assert {obj["kind"] for obj in everything.objects} >= OPTIONAL_KINDS
    assert len(everything.of_kind("PodDisruptionBudget")) == 2, "the gateway's and the operator's"
    assert CHART / "ci" / "everything-values.yaml" in CI_VALUES


@pytest.mark.parametrize("name", SETS)
def test_helm_lint_strict(name: str) -> None:
    """At the oldest and the newest Kubernetes the chart claims (lint checks API deprecations
    against the version)."""
    versions = kube_versions()
    for version in (versions[0], versions[-1]):
        assert lint(VALUE_SETS[name], kube_version=version) == [], version


@pytest.mark.parametrize("name", SETS)
def test_every_object_validates_strictly_for_every_claimed_kubernetes(name: str) -> None:
    rendering = render(VALUE_SETS[name])
    assert len(rendering.objects) >= 10
    for version in kube_versions():
        for obj in rendering.objects:
            validate(obj, version)


def test_the_validators_refuse_what_they_should() -> None:
    """Each validator the rendered objects go through fails on a typo, so passing means
    something."""
    rendering = render(VALUE_SETS["everything"])
    for kind in ("Deployment", "ServiceMonitor", "PrometheusRule", "ClusterKopfPeering"):
        obj = rendering.of_kind(kind)[0]
        typo: dict[str, Any] = yaml.safe_load(yaml.safe_dump(obj))
        typo["metadata"]["lables"] = {"a": "b"}
        with pytest.raises(Exception, match="lables"):
            validate(typo, "1.30")
    monitor = rendering.one("ServiceMonitor")
    monitor["spec"]["endpoints"][0]["honorLabel"] = True
    with pytest.raises(Exception, match="honorLabel"):
        validate(monitor, "1.30")
    rules = rendering.one("PrometheusRule")
    rules["spec"]["groups"][0]["rules"][0]["for"] = 5
    with pytest.raises(Exception, match="not of type 'string'"):
        validate(rules, "1.30")


@pytest.mark.parametrize("name", SETS)
def test_every_name_and_label_is_one_the_api_server_accepts(name: str) -> None:
    rendering = render(VALUE_SETS[name])
    assert [problem for obj in rendering.objects for problem in name_problems(obj)] == []


# Release names from 40 characters to Helm's limit (53), and overrides up to a Service name's
# limit (63).
LONG_NAMES = [
    ("r" * 40, {}),
    ("release-" + "4" * 38 + "-x", {}),
    ("x" * 53, {}),
    ("team-" + "s" * 38 + "-snooze", {}),
    ("prod", {"fullnameOverride": "f" * 63}),
    ("prod", {"nameOverride": "n" * 63}),
]


@pytest.mark.parametrize(
    ("release", "overrides"), LONG_NAMES, ids=[f"{len(r)}-{sorted(o)}" for r, o in LONG_NAMES]
)
def test_long_release_names_give_valid_and_distinct_names(
    release: str, overrides: dict[str, str]
) -> None:
    helm.validate_release_name(release)
    rendering = render({**VALUE_SETS["everything"], **overrides}, release=release)
    assert [problem for obj in rendering.objects for problem in name_problems(obj)] == []
    names = [
        (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        for obj in rendering.objects
    ]
    assert len(names) == len(set(names))
    services = [obj["metadata"]["name"] for obj in rendering.of_kind("Service")]
    assert len(set(services)) == 3
    # Every reference to a Service or account still names an object the release created.
    gateway = rendering.one("Service", "-gateway")["metadata"]["name"]
    assert f"svc/{gateway} " in rendering.notes
    accounts = {obj["metadata"]["name"] for obj in rendering.of_kind("ServiceAccount")}
    for deployment in rendering.of_kind("Deployment"):
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] in accounts


def test_two_long_release_names_with_one_prefix_do_not_collide() -> None:
    """Cut names keep a hash of the whole name, so that two releases in one namespace differ."""
    first = render(release="a" * 50 + "one")
    second = render(release="a" * 50 + "two")
    names = {obj["metadata"]["name"] for obj in first.objects if obj["kind"] == "Service"}
    assert not names & {obj["metadata"]["name"] for obj in second.objects}


CLUSTER_SCOPED = ("ClusterRole", "ClusterRoleBinding")


def cluster_scoped(rendering: Rendering) -> set[str]:
    return {obj["metadata"]["name"] for obj in rendering.objects if obj["kind"] in CLUSTER_SCOPED}


@pytest.mark.parametrize(
    ("release", "namespace"), [("snooze", "team-a"), ("a" * 53, "n" * 63)], ids=["short", "long"]
)
def test_one_release_name_in_two_namespaces_gives_distinct_cluster_roles(
    release: str, namespace: str
) -> None:
    """ClusterRoles and their bindings share one space of names across namespaces: two
    installs of one release name must not take (or, on uninstall, delete) each other's."""
    first = render(release=release, namespace=namespace)
    second = render(release=release, namespace=namespace[:-1] + "b")
    assert len(cluster_scoped(first)) == 2  # the operator's and the gateway's (role and binding)
    assert not cluster_scoped(first) & cluster_scoped(second)
    for rendering in (first, second):
        assert [p for obj in rendering.objects for p in name_problems(obj)] == []
        roles = {o["metadata"]["name"] for o in rendering.of_kind("ClusterRole")}
        for binding in rendering.of_kind("ClusterRoleBinding"):
            assert binding["roleRef"]["name"] in roles
            assert binding["subjects"][0]["namespace"] in (namespace, namespace[:-1] + "b")


def test_short_names_are_unchanged() -> None:
    """Names that fit are what they always were (upgrades do not rename objects)."""
    assert {obj["metadata"]["name"] for obj in render().of_kind("Service")} == {
        "snooze-gateway",
        "snooze-operator-metrics",
        "snooze-gateway-metrics",
    }
    assert render(release="prod").one("Deployment", "-gateway")["metadata"]["name"] == (
        "prod-snooze-gateway"
    )


def test_the_kube_version_floor_is_what_the_crd_needs() -> None:
    """The CRD's validation rules use `fieldPath` and `reason`, which Kubernetes 1.28 brought:
    the chart claims no older Kubernetes, and 1.27's schema indeed refuses the CRD."""
    crd = load_yaml(CRDS / "inferencemodels.snooze.dev.yaml")
    text = yaml.safe_dump(crd)
    assert "fieldPath:" in text
    assert kube_versions()[0] == "1.28"
    assert load_yaml(CHART / "Chart.yaml")["kubeVersion"] == ">=1.28.0-0"
    with pytest.raises(Exception, match=r"fieldPath|reason"):
        validate_builtin(crd, "1.27")


def test_the_crds_validate_for_every_claimed_kubernetes() -> None:
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            for version in kube_versions():
                validate_builtin(crd, version)


def test_docs_state_the_kube_version_floor() -> None:
    for doc in (CHART / "README.md", CHART.parents[1] / "README.md"):
        assert "Kubernetes 1.28" in doc.read_text(), doc


@pytest.mark.needs("promtool")
@pytest.mark.parametrize("name", [name for name in SETS if VALUE_SETS[name].get("prometheusRule")])
def test_promtool_checks_the_rendered_rules(name: str, tmp_path: Path) -> None:
    rule = render(VALUE_SETS[name]).one("PrometheusRule")
    path = tmp_path / "rendered.rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    promtool = shutil.which("promtool")
    assert promtool is not None
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(group["rules"]) for group in rule["spec"]["groups"])
    assert re.search(rf"SUCCESS: {count} rules found", result.stdout), result.stdout


def test_notes_name_the_gateway_and_an_unambiguous_resource() -> None:
    """The Gateway API Inference Extension also has an `inferencemodels`: the notes name ours
    by its group."""
    notes = render(release="prod").notes
    assert "http://prod-snooze-gateway.snooze.svc:80/v1" in notes
    assert "kubectl get inferencemodels.snooze.dev -A" in notes
    assert "networkPolicy.enabled is false" not in notes
    assert "no engine is fenced off" in notes
    everything = render(VALUE_SETS["everything"]).notes
    assert "no engine is fenced off" not in everything and "No Prometheus" not in everything


def test_monitoring_objects_need_prometheus_operators_api_and_say_so() -> None:
    """A ServiceMonitor or PrometheusRule sent to a cluster without their CRDs fails the whole
    install, naming neither value: the chart leaves them out there and its notes say why."""
    everything = VALUE_SETS["everything"]
    served = render(everything)
    assert served.of_kind("ServiceMonitor") and served.of_kind("PrometheusRule")
    assert "serves no monitoring.coreos.com" not in served.notes
    bare = render(everything, api_versions=[])
    assert not bare.of_kind("ServiceMonitor") and not bare.of_kind("PrometheusRule")
    for kind, value in (("ServiceMonitor", "serviceMonitor"), ("PrometheusRule", "prometheusRule")):
        assert (
            f"{value}.enabled is true, but this cluster serves no monitoring.coreos.com/v1\n{kind}"
        ) in bare.notes
        assert f"--api-versions monitoring.coreos.com/v1/{kind}" in bare.notes
    # Only what the cluster lacks is left out.
    half = render(everything, api_versions=["monitoring.coreos.com/v1/ServiceMonitor"])
    assert half.of_kind("ServiceMonitor") and not half.of_kind("PrometheusRule")


def test_the_notes_warn_while_the_image_is_the_unpublished_default() -> None:
    assert "nobody\npublishes Snooze's image" in render().notes
    named = render({"image": {"repository": "registry.example.com/snooze", "tag": "0.1.0"}})
    assert "publishes Snooze's image" not in named.notes
    deployment = named.one("Deployment", "-operator")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/snooze:0.1.0"
