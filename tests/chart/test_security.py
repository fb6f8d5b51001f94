"""Every pod the chart runs is non-root, read-only, without capabilities, seccomp'd, probed and
sized by default, and each of those settings can be overridden (OpenShift picks its own uids)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from chart_helpers import ROOT, manifest_templates
from rendering import VALUE_SETS, render

POD_TEMPLATES = [
    p for p in manifest_templates() if re.search(r"^\s+containers:", p.read_text(), re.M)
]
HARDENED_POD = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
HARDENED_CONTAINER = {
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pod_specs(values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Each Deployment's pod spec, by component."""
    return {
        deployment["metadata"]["labels"]["app.kubernetes.io/component"]: deployment["spec"][
            "template"
        ]["spec"]
        for deployment in render(values).of_kind("Deployment")
    }


def test_the_pod_templates_are_the_two_deployments() -> None:
    assert sorted(p.name for p in POD_TEMPLATES) == [
        "gateway-deployment.yaml",
        "operator-deployment.yaml",
    ]
    assert sorted(pod_specs()) == ["gateway", "operator"]


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_pods_are_hardened_by_default(name: str) -> None:
    for component, spec in pod_specs(VALUE_SETS[name]).items():
        assert spec["securityContext"] == HARDENED_POD, component
        for container in spec["containers"]:
            assert container["securityContext"] == HARDENED_CONTAINER, component


def test_openshift_unsets_the_ids_and_keeps_the_rest() -> None:
    """OpenShift's restricted SCC assigns a uid from the namespace's range and refuses pods
    that ask for another: `--set podSecurityContext.runAsUser=null` removes it."""
    values = {"podSecurityContext": {"runAsUser": None, "runAsGroup": None}}
    for component, spec in pod_specs(values).items():
        assert spec["securityContext"] == {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }, component
        assert spec["containers"][0]["securityContext"] == HARDENED_CONTAINER


def test_security_contexts_are_overridable() -> None:
    values = {
        "podSecurityContext": {"runAsUser": 1000700000, "fsGroup": 1000700000},
        "containerSecurityContext": {
            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
        },
    }
    for spec in pod_specs(values).values():
        assert spec["securityContext"]["runAsUser"] == 1000700000
        assert spec["securityContext"]["fsGroup"] == 1000700000
        assert spec["securityContext"]["runAsNonRoot"] is True
        context = spec["containers"][0]["securityContext"]
        assert context["capabilities"] == {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
        assert context["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_probes_and_writable_tmp(name: str) -> None:
    for component, spec in pod_specs(VALUE_SETS[name]).items():
        [container] = spec["containers"]
        for probe in ("livenessProbe", "readinessProbe"):
            assert "httpGet" in container[probe], f"{component}: no HTTP {probe}"
        mount, *others = container["volumeMounts"]
        assert mount["mountPath"] == "/tmp"
        volume, *secrets = spec["volumes"]
        assert volume == {"name": mount["name"], "emptyDir": {}}
        # Besides, only the endpoint pickers' token (inferenceGateway), read-only.
        assert [m["mountPath"] for m in others if m["readOnly"]] == (
            ["/var/run/snooze/picker"] if others else []
        )
        assert [v["secret"]["secretName"].endswith("-picker-token") for v in secrets] == (
            [True] if others else []
        )
        assert not spec.get("hostNetwork") and not spec.get("hostPID")


def test_both_containers_have_requests_and_limits_by_default() -> None:
    for component, spec in pod_specs().items():
        resources = spec["containers"][0]["resources"]
        for kind in ("requests", "limits"):
            assert set(resources[kind]) == {"cpu", "memory"}, f"{component} {kind}"


def test_resources_merge_with_and_unset_from_values() -> None:
    values = {"gateway": {"resources": {"limits": {"cpu": None, "memory": "4Gi"}}}}
    resources = pod_specs(values)["gateway"]["containers"][0]["resources"]
    assert resources == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "4Gi"},
    }


def test_the_operator_runs_one_replica_by_default() -> None:
    assert render().one("Deployment", "-operator")["spec"]["replicas"] == 1


def test_image_runs_as_the_charts_user() -> None:
    """The image's USER is the default uid, so that pods whose uid is unset (OpenShift) or set
    run the same way."""
    dockerfile = (ROOT / "images" / "operator" / "Dockerfile").read_text()
    assert "USER 10001:10001" in dockerfile
    assert 'ENTRYPOINT ["snooze"]' in dockerfile
    assert HARDENED_POD["runAsUser"] == HARDENED_POD["runAsGroup"] == 10001
