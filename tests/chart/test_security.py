"""Every pod the chart runs is non-root, read-only, without capabilities, seccomp'd and probed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from chart_helpers import manifest_templates, values

POD_TEMPLATES = [
    p for p in manifest_templates() if re.search(r"^\s+containers:", p.read_text(), re.M)
]

# Lines each pod template must hold: pod-level, then container-level (literal, not from values,
# so that no values file can switch them off).
POD_SECURITY = [
    "securityContext:",
    "runAsNonRoot: true",
    "seccompProfile:",
    "type: RuntimeDefault",
]
CONTAINER_SECURITY = [
    "runAsNonRoot: true",
    "readOnlyRootFilesystem: true",
    "allowPrivilegeEscalation: false",
    'drop: ["ALL"]',
    "type: RuntimeDefault",
]


def _block(text: str, key: str) -> str:
    """The lines under `key:` (first occurrence), by indentation."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.strip() == f"{key}:":
            indent = len(line) - len(line.lstrip())
            block = []
            for following in lines[index + 1 :]:
                if following.strip() and len(following) - len(following.lstrip()) <= indent:
                    break
                block.append(following.strip())
            return "\n".join(block)
    raise AssertionError(f"no {key}: block")


def test_the_pod_templates_are_the_two_deployments() -> None:
    assert sorted(p.name for p in POD_TEMPLATES) == [
        "gateway-deployment.yaml",
        "operator-deployment.yaml",
    ]


@pytest.mark.parametrize("path", POD_TEMPLATES, ids=lambda p: p.name)
def test_pod_and_container_security_contexts(path: Path) -> None:
    text = path.read_text()
    pod_spec = text.split("    spec:\n", 1)[1]
    pod_level = _block(pod_spec.split("containers:", 1)[0], "securityContext")
    for line in POD_SECURITY[1:]:
        assert line in pod_level, f"{path.name}: pod securityContext lacks {line}"
    listed = text.split("      containers:\n", 1)[1].split("\n      volumes:\n", 1)[0]
    containers = re.split(r"^        - name: ", listed, flags=re.M)[1:]
    assert containers, f"{path.name}: no containers"
    for container in containers:
        context = _block(container, "securityContext")
        for line in CONTAINER_SECURITY:
            assert line in context, f"{path.name}: container securityContext lacks {line}"


@pytest.mark.parametrize("path", POD_TEMPLATES, ids=lambda p: p.name)
def test_probes_and_writable_tmp(path: Path) -> None:
    text = path.read_text()
    for probe in ("livenessProbe", "readinessProbe"):
        assert "httpGet:" in _block(text, probe), f"{path.name}: no HTTP {probe}"
    assert "mountPath: /tmp" in text and "emptyDir: {}" in text
    assert "privileged" not in text and "hostNetwork" not in text and "hostPath" not in text


@pytest.mark.parametrize("path", POD_TEMPLATES, ids=lambda p: p.name)
def test_resources_come_only_from_values(path: Path) -> None:
    text = path.read_text()
    assert re.search(
        r"\{\{- with \.Values\.(operator|gateway)\.resources \}\}\n\s+resources:", text
    )
    assert text.count("resources:") == 1


def test_resources_unset_by_default_and_operator_single() -> None:
    defaults = values()
    assert defaults["operator"]["resources"] == {} and defaults["gateway"]["resources"] == {}
    assert defaults["operator"]["replicas"] == 1


def test_image_runs_as_the_charts_user() -> None:
    from chart_helpers import ROOT

    dockerfile = (ROOT / "images" / "operator" / "Dockerfile").read_text()
    assert "USER 10001:10001" in dockerfile
    assert 'ENTRYPOINT ["snooze"]' in dockerfile
    for path in POD_TEMPLATES:
        assert "runAsUser: 10001" in path.read_text()
