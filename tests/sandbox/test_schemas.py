"""The sandbox's schemas and its field checks, without HTTP: one rule per case."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import builders
import pytest
import yaml
from builtin_schemas import generate

from snooze.sandbox import discovery, schemas, validation
from snooze.sandbox.api import ApiError

CRD = yaml.safe_load(
    (Path(__file__).parents[2] / "crds" / "inferencemodels.snooze.dev.yaml").read_text()
)


def test_builtin_schemas_are_the_generated_ones() -> None:
    with gzip.open(schemas.BUILTIN_FILE, "rt") as f:
        assert json.load(f) == generate(), (
            "the built-in schemas are stale: run `python tests/sandbox/builtin_schemas.py`"
        )


def test_every_served_builtin_kind_has_a_schema() -> None:
    registry = discovery.builtin_registry()
    kinds = {(s.group, s.version, s.kind) for s in registry.specs.values()}
    assert kinds <= set(schemas.builtin_kinds())
    assert ("", "v1", "Pod") in kinds and ("apps", "v1", "Deployment") in kinds
    # Gateway API and metrics.k8s.io come with CRDs or metrics-server, not with Kubernetes.
    assert not {g for g, _, _ in kinds} & {"gateway.networking.k8s.io", "metrics.k8s.io"}


def _check(kind: str, obj: dict[str, Any], directive: str = "Strict") -> validation.Check:
    registry = discovery.builtin_registry()
    registry.register_crd(CRD)
    spec = next(s for s in registry.specs.values() if s.kind == kind)
    check = validation.check_for(spec, {"fieldValidation": directive}, method="POST")
    check(obj)
    return check


def pod(**container: Any) -> dict[str, Any]:
    """The builders' pod, with these fields on its container."""
    return builders.pod(builders.CONTAINER | container)


@pytest.mark.parametrize(
    "container",
    [
        {"resources": {"limits": {"cpu": 1, "memory": "1Gi"}, "requests": {"cpu": 0.5}}},
        {"ports": [{"containerPort": 80}], "livenessProbe": {"httpGet": {"port": "http"}}},
        {"livenessProbe": {"httpGet": {"port": 8080}}, "image": None},
    ],
)
def test_builtin_values_a_decoder_takes(container: dict[str, Any]) -> None:
    obj = pod(**container)
    _check("Pod", obj)
    assert obj == pod(**container)


@pytest.mark.parametrize(
    ("container", "message"),
    [
        ({"ports": [{"containerPort": "80"}]},
         "json: cannot unmarshal string into Go struct field ContainerPort.spec.containers.ports"
         ".containerPort of type int32"),
        ({"livenessProbe": {"httpGet": {"port": True}}},
         "json: cannot unmarshal bool into Go struct field HTTPGetAction.spec.containers"
         ".livenessProbe.httpGet.port of type intstr.IntOrString"),
        ({"resources": {"limits": {"cpu": []}}},
         "json: cannot unmarshal array into Go struct field ResourceRequirements.spec.containers"
         ".resources.limits of type resource.Quantity"),
        ({"args": "--serve"},
         "json: cannot unmarshal string into Go struct field Container.spec.containers.args of"
         " type []string"),
    ],
)  # fmt: skip
def test_builtin_values_a_decoder_refuses(container: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiError) as refused:
        _check("Pod", pod(**container), directive="Ignore")
    assert refused.value.code == 400
    assert refused.value.message == f'Pod in version "v1" cannot be handled as a Pod: {message}'


def test_unknown_fields_by_directive() -> None:
    with pytest.raises(ApiError, match=r'unknown field "metadata.lables", unknown field "spec.x"'):
        _check("Pod", pod() | {"metadata": {"name": "p", "lables": {}}, "spec": {"x": 1}})
    for directive, warnings in (("Warn", ['unknown field "spec.containers[0].x"']), ("Ignore", [])):
        obj = pod(x=1)
        assert _check("Pod", obj, directive).warnings == warnings
        assert obj == pod()  # dropped either way


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"minAwake": "1"},
         'spec.minAwake: Invalid value: "string": spec.minAwake in body must be of type integer:'
         ' "string"'),
        ({"selector": {}},
         'spec.selector: Invalid value: "object": spec.selector in body must validate at least'
         " one schema (anyOf)"),
        ({"desiredState": "Sleepy"},
         'spec.desiredState: Unsupported value: "Sleepy": supported values: "Auto", "Awake",'
         ' "Asleep"'),
        ({"minAwake": -1},
         "spec.minAwake: Invalid value: -1: spec.minAwake in body should be greater than or equal"
         " to 0"),
        ({"idle": {"after": "soon"}},
         "spec.idle.after: Invalid value: \"soon\": spec.idle.after in body should match"),
    ],
)  # fmt: skip
def test_crd_rules(spec: dict[str, Any], problem: str) -> None:
    with pytest.raises(ApiError) as refused:
        _check("InferenceModel", builders.model(**spec))
    assert refused.value.code == 422
    assert refused.value.message.startswith('InferenceModel.snooze.dev "m" is invalid: ')
    assert problem in refused.value.message
    causes = (refused.value.details or {})["causes"]
    assert causes[0]["field"] == problem.split(":")[0]


def test_crd_accepts_what_its_schema_allows() -> None:
    obj = builders.model(minAwake=2.0, idle={"after": "20s"}, wake={"onRequest": True})
    obj["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    kept = copy.deepcopy(obj)
    _check("InferenceModel", obj)
    assert obj == kept
    preserving = copy.deepcopy(CRD)
    root = preserving["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    root["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"] = True
    (gvk, schema), = schemas.crd_kinds(preserving).values()  # fmt: skip
    check = validation.Check(kind=gvk[2], group=gvk[0], version=gvk[1], schema=schema,
                             custom=True, directive="Strict")  # fmt: skip
    check(builders.model(anything={"goes": 1}))
