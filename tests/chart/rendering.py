"""The chart rendered by real Helm (v4, the helm-python-sdk library), and the schemas its objects
are validated against: Kubernetes' (kubernetes-validate) and prometheus-operator's CRDs."""

from __future__ import annotations

import base64
import copy
import functools
import hashlib
import json
import re
import tarfile
from dataclasses import dataclass
from typing import Any

import helm_python as helm
import helm_python._native as helm_native
import jsonschema
import kubernetes_validate.utils as kubernetes_validate
import pytest
import yaml
from chart_helpers import CHART, ROOT, load_yaml

RELEASE = "snooze"
NAMESPACE = "snooze"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
# Each value set the chart is rendered with: the defaults, and every ci/*-values.yaml (one of
# which turns on every optional feature).
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    **{path.name.removesuffix("-values.yaml"): load_yaml(path) for path in CI_VALUES},
}

# prometheus-operator's CRD schemas as npm's @kubernetes-models/prometheus-operator 4.0.0 ships
# them (generated from prometheus-operator v0.57.0's CRDs); tests/run fetches the package with
# `npm pack`. Its integrity is the registry's, so what is validated against is exactly that.
PROMETHEUS_OPERATOR_PACKAGE = (
    ROOT / ".cache" / "npm" / "kubernetes-models-prometheus-operator-4.0.0.tgz"
)
PROMETHEUS_OPERATOR_INTEGRITY = (
    "sha512-3d2aR/ezuAa0KLsbG618n1QUf8kQP0UV42FNGR6/+sec7/"
    "URCZqzOjy6sDBtHob3d/1/pBdov3PqUDK/kl9sFQ=="
)
MONITORING_KINDS = ("ServiceMonitor", "PrometheusRule")

# kubernetes-validate reads its schema files again for every object; they never change.
kubernetes_validate.schema_contents = functools.cache(kubernetes_validate.schema_contents)


def kube_versions() -> list[str]:
    """Every Kubernetes minor from the chart's kubeVersion floor to the newest that
    kubernetes-validate knows."""
    floor = load_yaml(CHART / "Chart.yaml")["kubeVersion"]
    match = re.fullmatch(r">=1\.(\d+)\.0-0", floor)
    assert match, f"Chart.yaml kubeVersion {floor!r} is not the expected `>=1.N.0-0` form"
    newest = int(kubernetes_validate.latest_version().split(".")[1])
    return [f"1.{minor}" for minor in range(int(match.group(1)), newest + 1)]


@dataclass(frozen=True)
class Rendering:
    """What `helm template` prints for one value set: the objects, by template, and NOTES.txt."""

    objects: list[dict[str, Any]]
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def one(self, kind: str, name_suffix: str = "") -> dict[str, Any]:
        [found] = [
            obj for obj in self.of_kind(kind) if obj["metadata"]["name"].endswith(name_suffix)
        ]
        return found


# What a cluster with prometheus-operator serves: the chart renders its monitoring objects only
# where the cluster has their kinds (`.Capabilities.APIVersions.Has`).
MONITORING_APIS = [f"monitoring.coreos.com/v1/{kind}" for kind in MONITORING_KINDS]


def render(
    values: dict[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    api_versions: list[str] = MONITORING_APIS,
) -> Rendering:
    """Render the chart as `helm install` would (schema validation included), offline, for a
    cluster that serves these API versions besides Kubernetes' own (`helm template
    --api-versions`)."""
    options = {"name": release, "namespace": namespace, "is_install": True}
    with helm.Chart.load(CHART) as chart:
        # Chart.render has no api_versions argument, but the native call it makes takes them
        # (helm-python-sdk 0.2.2, pinned): the same options, one more.
        manifests = json.loads(
            helm_native.call_string(
                "helm_render",
                chart._raw(),
                json.dumps(values or {}),
                json.dumps({**options, "api_versions": api_versions}),
            )
        )
    objects = [
        obj
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if obj
    ]
    return Rendering(objects=objects, notes=manifests.get(f"{CHART.name}/templates/NOTES.txt", ""))


def render_error(values: dict[str, Any], **kwargs: str) -> str:
    """The message Helm refuses these values with."""
    with pytest.raises(helm.HelmError) as refused:
        render(values, **kwargs)
    return str(refused.value)


def lint(values: dict[str, Any], *, kube_version: str) -> list[dict[str, Any]]:
    """`helm lint --strict` of the chart with these values: its findings above info level."""
    report = helm.lint(
        CHART, values, strict=True, namespace=NAMESPACE, kube_version=f"v{kube_version}.0"
    )
    assert report["total_charts_linted"] == 1, report
    findings: list[dict[str, Any]] = [m for m in report["messages"] if m["severity"] >= 2]
    return findings + [{"error": error} for error in report["errors"]]


def validate_builtin(obj: dict[str, Any], kube_version: str) -> None:
    """kubernetes-validate --strict: the object's schema in that Kubernetes version, unknown
    fields refused."""
    kubernetes_validate.validate(obj, kube_version, strict=True)


def validate_metadata(obj: dict[str, Any], kube_version: str) -> None:
    """A custom resource's metadata against Kubernetes' own ObjectMeta (a ConfigMap carries it)."""
    validate_builtin(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}, kube_version
    )


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD's schema as the API server applies it under kubectl's default strict field
    validation: an unknown field is refused, not silently pruned."""
    schema = copy.deepcopy(schema)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for item in node:
                close(item)

    close(schema["properties"]["spec"])
    return schema


@functools.cache
def prometheus_operator_validators() -> dict[str, jsonschema.Draft7Validator]:
    """The ServiceMonitor's and PrometheusRule's CRD schemas, closed, by kind."""
    path = PROMETHEUS_OPERATOR_PACKAGE
    if not path.is_file():
        pytest.fail(
            f"{path.relative_to(ROOT)} is missing: run the tests with `bash tests/run`, which "
            "fetches it (npm pack @kubernetes-models/prometheus-operator@4.0.0)",
            pytrace=False,
        )
    digest = base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()
    assert f"sha512-{digest}" == PROMETHEUS_OPERATOR_INTEGRITY, f"{path} is not the pinned package"
    schemas = {}
    with tarfile.open(path) as archive:
        for kind in MONITORING_KINDS:
            member = archive.extractfile(f"package/monitoring.coreos.com/v1/{kind}.js")
            assert member is not None
            # The module holds the CRD's openAPIV3Schema as a JSON object literal.
            match = re.search(r"^const schema = (\{.*?^\});$", member.read().decode(), re.M | re.S)
            assert match, f"no schema literal in the package's {kind}.js"
            schema = json.loads(match.group(1))
            assert schema["properties"]["kind"]["enum"] == [kind]
            # metadata is a reference to ObjectMeta, validated by validate_metadata instead.
            schema["properties"].pop("metadata")
            schemas[kind] = checked(closed(schema))
    return schemas


@functools.cache
def chart_crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    """The schemas of the CRDs the chart itself ships (crds/), closed, by (apiVersion, kind)."""
    schemas = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            for version in crd["spec"]["versions"]:
                api_version = f"{crd['spec']['group']}/{version['name']}"
                schema = version["schema"]["openAPIV3Schema"]
                if "spec" in schema.get("properties", {}):
                    schema = closed(schema)
                schemas[(api_version, crd["spec"]["names"]["kind"])] = checked(schema)
    return schemas


def checked(schema: dict[str, Any]) -> jsonschema.Draft7Validator:
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def validate(obj: dict[str, Any], kube_version: str) -> str:
    """Validate one rendered object strictly against the schema its kind has, and say which."""
    kind, api_version = obj["kind"], obj["apiVersion"]
    if api_version == "monitoring.coreos.com/v1" and kind in MONITORING_KINDS:
        validate_metadata(obj, kube_version)
        prometheus_operator_validators()[kind].validate(obj)
        return "prometheus-operator v0.57.0 CRD"
    crds = chart_crd_validators()
    if (api_version, kind) in crds:
        validate_metadata(obj, kube_version)
        crds[(api_version, kind)].validate(obj)
        return "the chart's CRD"
    validate_builtin(obj, kube_version)
    return f"Kubernetes {kube_version}"


# Kubernetes' name rules (k8s.io/apimachinery/pkg/util/validation).
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def name_problems(obj: dict[str, Any]) -> list[str]:
    """What the API server would refuse in the object's name and labels."""
    name = obj["metadata"]["name"]
    where = f"{obj['kind']} {name!r}"
    problems = []
    # Every name the chart makes is a DNS label: Services and namespaces must be one, and a
    # Deployment's name goes into its pods' hostnames.
    pattern = DNS_1035_LABEL if obj["kind"] == "Service" else DNS_LABEL
    if len(name) > 63 or not pattern.fullmatch(name):
        problems.append(f"{where}: {len(name)} characters, not a DNS label")
    label_sets = [obj["metadata"].get("labels", {})]
    template = obj.get("spec", {}).get("template", {}).get("metadata", {})
    label_sets.append(template.get("labels", {}))
    for labels in label_sets:
        for key, value in labels.items():
            if len(str(value)) > 63 or not LABEL_VALUE.fullmatch(str(value)):
                problems.append(f"{where}: label {key}={value!r} is not a valid label value")
    return problems
