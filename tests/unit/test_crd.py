"""The CRD generated from the models: checked in, structural, valid, and as strict as the models."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from snooze.api import crd, gpupool, models

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / "crds" / "inferencemodels.snooze.dev.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("inferencemodel-*.yaml"))
KINDS = list(crd.CRDS)


@pytest.mark.parametrize("kind", KINDS)
def test_checked_in_crds_are_the_generated_ones(kind: str) -> None:
    name = crd.file_name(kind)
    for where in (ROOT / "crds", ROOT / "charts" / "snooze" / "crds"):
        assert (where / name).read_text() == crd.render(kind), (
            f"{where.name}/{name} is stale: run `snooze crd --kind {kind} > crds/{name}` "
            f"and copy it to charts/snooze/crds/"
        )


def test_snooze_crd_command_prints_them_all() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "snooze.cli", "crd"], capture_output=True, text=True, check=True
    )
    documents = list(yaml.safe_load_all(out.stdout))
    assert [d["spec"]["names"]["kind"] for d in documents] == KINDS
    single = subprocess.run(
        [sys.executable, "-m", "snooze.cli", "crd", "--kind", "InferenceModel"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert single.stdout == CHECKED_IN.read_text()


@pytest.mark.parametrize("kind", KINDS)
def test_crd_passes_kubernetes_validate_strict(kind: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubernetes_validate",
            "--strict",
            str(ROOT / "crds" / crd.file_name(kind)),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _walk(schema: dict[str, Any], path: str, in_junctor: bool = False) -> list[str]:
    """Every rule of a structural schema that this schema breaks, with where."""
    problems = []
    if "$ref" in schema:
        problems.append(f"{path}: $ref")
    if not in_junctor and "type" not in schema:
        problems.append(f"{path}: no type")
    if in_junctor and {"type", "description", "default", "nullable"} & schema.keys():
        problems.append(f"{path}: type/description/default inside anyOf")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{path}: properties and additionalProperties together")
    for option in schema.get("anyOf", []):
        if option.get("type") == "null":
            problems.append(f"{path}: nullable anyOf")
        problems += _walk(option, f"{path}.anyOf", in_junctor=True)
    for name, prop in schema.get("properties", {}).items():
        if not in_junctor and name != "metadata" and not prop.get("description"):
            problems.append(f"{path}.{name}: no description")
        problems += _walk(prop, f"{path}.{name}", in_junctor)
    if isinstance(schema.get("items"), dict):
        problems += _walk(schema["items"], f"{path}[]", in_junctor)
    if isinstance(schema.get("additionalProperties"), dict):
        problems += _walk(schema["additionalProperties"], f"{path}{{}}", in_junctor)
    return problems


def test_schema_is_structural_and_described() -> None:
    assert _walk(crd.openapi_schema(), "") == []
    assert _walk(crd.pool_openapi_schema(), "") == []


def test_the_pool_crd_has_its_short_name_and_columns() -> None:
    body = crd.pool_crd()
    assert body["spec"]["names"]["shortNames"] == ["gpool"]
    columns = [c["name"] for c in body["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Memory", "Used", "Awake", "Waiting", "Evictions", "Age"]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "memory"),
        ({"memory": "80 GB"}, "memory"),
        ({"memory": "80Gi", "eviction": "Random"}, "eviction"),
        ({"memory": "80Gi", "minResidency": "soon"}, "minResidency"),
        ({"memory": "80Gi", "hostMemory": "-1Gi"}, "hostMemory"),
        ({"memory": "80Gi", "resourceClaimName": "Not_A_Name"}, "resourceClaimName"),
        ({"memory": "80Gi", "evict": "LeastRecentlyUsed"}, "evict"),
    ],
)
def test_a_bad_pool_is_refused_by_schema_and_models(spec: dict[str, Any], field: str) -> None:
    schema = copy.deepcopy(crd.pool_openapi_schema()["properties"]["spec"])
    schema["additionalProperties"] = False
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(spec))
    assert errors and field in " ".join(
        ".".join(str(p) for p in e.absolute_path) + " " + e.message for e in errors
    )
    with pytest.raises(models.SpecError, match=f"spec.{field}"):
        gpupool.parse_pool_spec(spec)


def test_pool_defaults() -> None:
    pool = gpupool.parse_pool_spec({"memory": "80Gi"})
    assert pool.memory_bytes == 80 * 2**30
    assert pool.eviction is gpupool.Eviction.LEAST_RECENTLY_USED
    assert pool.min_residency_seconds == 30
    assert pool.host_memory_bytes is None


def test_status_subresource_columns_and_short_name() -> None:
    version = crd.crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    names = [column["name"] for column in version["additionalPrinterColumns"]]
    assert names[:5] == ["Model", "Phase", "Awake", "Asleep", "Last Wake"]
    assert names[-1] == "Age"
    assert crd.crd()["spec"]["names"]["shortNames"] == ["im"]


def strict_schema() -> dict[str, Any]:
    """The CRD's schema as the API server applies it under kubectl's default strict field
    validation: an unknown field is refused, not silently pruned."""
    schema = copy.deepcopy(crd.openapi_schema())

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and node is not schema["properties"].get("metadata"):
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for item in node:
                close(item)

    close(schema["properties"]["spec"])
    return schema


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(path: Path) -> None:
    resource = yaml.safe_load(path.read_text())
    jsonschema.validate(resource, strict_schema())
    spec = models.parse_spec(resource["spec"])
    assert spec.selector.to_label_selector()


def _resource(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"selector": {"matchLabels": {"app": "m"}}}
    base.update(spec)
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": "m"},
        "spec": base,
    }


# (spec overrides, the field the error must name on the wire)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("bad duration", {"idle": {"after": "ten minutes"}}, "after"),
    ("duration without unit", {"idle": {"after": "600"}}, "after"),
    ("bad wake timeout", {"wake": {"timeout": "2 m"}}, "timeout"),
    ("level 3", {"sleep": {"level": 3}}, "level"),
    ("level 0", {"sleep": {"level": 0}}, "level"),
    ("negative minAwake", {"minAwake": -1}, "minAwake"),
    ("empty selector", {"selector": {}}, "selector"),
    ("empty matchLabels", {"selector": {"matchLabels": {}}}, "selector"),
    ("unknown field", {"idleAfter": "10m"}, "idleAfter"),
    ("unknown nested field", {"wake": {"onFail": "Restart"}}, "onFail"),
    ("bad onFailure", {"wake": {"onFailure": "Retry"}}, "onFailure"),
    ("bad desiredState", {"desiredState": "Sleeping"}, "desiredState"),
    ("port out of range", {"engine": {"port": 70000}}, "port"),
    ("bad scheme", {"engine": {"scheme": "grpc"}}, "scheme"),
    (
        "bad operator",
        {"selector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}},
        "operator",
    ),
    ("scale target kind", {"scaleTargetRef": {"kind": "Pod", "name": "x"}}, "kind"),
    ("empty model name", {"modelName": ""}, "modelName"),
    ("pool without a name", {"pool": {"memory": "30Gi"}}, "name"),
    ("pool memory not a quantity", {"pool": {"name": "gpu", "memory": "thirty"}}, "memory"),
    ("pool priority out of range", {"pool": {"name": "gpu", "priority": 5000}}, "priority"),
    ("idle never misspelt", {"idle": {"after": "never"}}, "after"),
]


@pytest.mark.parametrize(("case", "spec", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_refused_by_schema(case: str, spec: dict[str, Any], field: str) -> None:
    resource = _resource(**spec)
    if "selector" in spec:
        resource["spec"]["selector"] = spec["selector"]
    errors = list(jsonschema.Draft7Validator(strict_schema()).iter_errors(resource))
    assert errors, f"{case}: the schema accepted it"
    where = " ".join(
        ".".join(str(p) for p in error.absolute_path) + " " + error.message for error in errors
    )
    assert field in where, where


@pytest.mark.parametrize(("case", "spec", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_refused_by_models(case: str, spec: dict[str, Any], field: str) -> None:
    resource = _resource(**spec)
    if "selector" in spec:
        resource["spec"]["selector"] = spec["selector"]
    with pytest.raises(models.SpecError) as raised:
        models.parse_spec(resource["spec"])
    message = str(raised.value)
    assert f"spec.{field}" in message or f".{field}" in message, message


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"idle": {"after": "0s"}}, "spec.idle.after: '0s' must be longer than zero"),
        (
            {"selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            "spec.selector.matchExpressions.0: operator In needs at least one value",
        ),
        (
            {
                "selector": {
                    "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
                }
            },
            "takes no values",
        ),
    ],
)
def test_what_only_the_models_refuse(spec: dict[str, Any], message: str) -> None:
    """Rules a structural schema cannot say are refused by the models (and reported on status)."""
    raw = {"selector": {"matchLabels": {"app": "m"}}, **spec}
    with pytest.raises(models.SpecError) as raised:
        models.parse_spec(raw)
    assert message in str(raised.value)


def test_idle_never_and_a_pool() -> None:
    spec = models.parse_spec(
        {
            "selector": {"matchLabels": {"app": "m"}},
            "idle": {"after": "Never"},
            "pool": {"name": "gpu-0", "memory": "30Gi", "priority": 2},
        }
    )
    assert spec.idle_after_seconds == float("inf")
    assert spec.pool is not None and spec.pool.memory_bytes == 30 * 2**30
    assert spec.pool.asleep_bytes == 2**30


def test_defaults() -> None:
    spec = models.parse_spec({"selector": {"matchLabels": {"app": "m"}}})
    assert spec.idle_after_seconds == 600
    assert spec.wake_timeout_seconds == 120
    assert spec.sleep.level == 1
    assert spec.engine.port == 8000
    assert spec.desired_state is models.DesiredState.AUTO
    assert spec.wake.on_failure == "Restart"
    assert spec.model_dump(by_alias=True)["minAwake"] == 0


def test_selector_string_and_matching() -> None:
    selector = models.LabelSelector.model_validate(
        {
            "matchLabels": {"app": "m"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "NotIn", "values": ["z"]},
                {"key": "gpu", "operator": "Exists"},
            ],
        }
    )
    assert selector.to_label_selector() == "app=m,tier in (a,b),!canary,zone notin (z),gpu"
    assert selector.matches({"app": "m", "tier": "a", "gpu": "1"})
    assert not selector.matches({"app": "m", "tier": "c", "gpu": "1"})
    assert not selector.matches({"app": "m", "tier": "a", "gpu": "1", "canary": "y"})
    assert not selector.matches({"app": "m", "tier": "a", "gpu": "1", "zone": "z"})
    assert not selector.matches({"app": "m", "tier": "a"})


def _cel_refusals(spec: dict[str, Any]) -> list[str]:
    """The messages of the CRD's CEL rules that `spec` breaks, evaluated as the API server
    does: after defaulting (here: the nested defaults the rules read)."""
    import celpy

    defaulted = {**spec, "idle": {"after": "10m", **spec.get("idle", {})}}
    env = celpy.Environment()
    refused = []
    for rule in crd.SPEC_RULES:
        program = env.program(env.compile(rule["rule"]))
        if not program.evaluate({"self": celpy.json_to_cel(defaulted)}):
            refused.append(f"spec{rule['fieldPath']}: {rule['message']}")
    return refused


TARGET = {"kind": "Deployment", "name": "chat"}
TIERS: list[tuple[str, dict[str, Any], str | None]] = [
    (
        "in order",
        {"idle": {"after": "10m"}, "scaleToZeroAfter": "2h", "scaleTargetRef": TARGET},
        None,
    ),
    ("default idle", {"scaleToZeroAfter": "1h", "scaleTargetRef": TARGET}, None),
    ("no target", {"scaleToZeroAfter": "2h"}, "needs scaleTargetRef"),
    (
        "zero before sleep",
        {"idle": {"after": "2h"}, "scaleToZeroAfter": "30m", "scaleTargetRef": TARGET},
        "must be longer than idle.after",
    ),
    (
        "equal",
        {"idle": {"after": "60m"}, "scaleToZeroAfter": "1h", "scaleTargetRef": TARGET},
        "must be longer than idle.after",
    ),
    (
        "never sleeps, so never goes to zero",
        {"idle": {"after": "Never"}, "scaleToZeroAfter": "1h", "scaleTargetRef": TARGET},
        "not Never",
    ),
]


@pytest.mark.parametrize(("case", "spec", "refusal"), TIERS, ids=[t[0] for t in TIERS])
def test_tier_order_refused_by_api_rules_and_models(
    case: str, spec: dict[str, Any], refusal: str | None
) -> None:
    full = {"selector": {"matchLabels": {"app": "m"}}, **spec}
    cel = _cel_refusals(full)
    if refusal is None:
        assert cel == []
        assert models.parse_spec(full).scale_to_zero_after == spec["scaleToZeroAfter"]
        return
    assert len(cel) == 1 and refusal in cel[0] and cel[0].startswith("spec.scaleToZeroAfter")
    with pytest.raises(models.SpecError) as raised:
        models.parse_spec(full)
    message = str(raised.value)
    assert message.startswith("spec.scaleToZeroAfter: ") and refusal in message, message


# metav1.Condition (k8s.io/apimachinery/pkg/apis/meta/v1/types.go), as its markers define it.
METAV1_CONDITION = {
    "type": {
        "type": "string",
        "maxLength": 316,
        "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
    },
    "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
    "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
    "lastTransitionTime": {"type": "string", "format": "date-time"},
    "reason": {
        "type": "string",
        "maxLength": 1024,
        "minLength": 1,
        "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
    },
    "message": {"type": "string", "maxLength": 32768},
}


@pytest.mark.parametrize("status_schema", [crd.status_schema, crd.pool_status_schema])
def test_conditions_are_metav1_conditions(status_schema: Callable[[], dict[str, Any]]) -> None:
    conditions = status_schema()["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    item = conditions["items"]
    assert list(item["properties"]) == list(METAV1_CONDITION)
    for name, expected in METAV1_CONDITION.items():
        found = {k: v for k, v in item["properties"][name].items() if k != "description"}
        assert found == expected, name
    assert set(item["required"]) == {"type", "status", "lastTransitionTime", "reason", "message"}


def _defaults(schema: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Every (path, default, the schema it defaults) in a schema."""
    found = []
    if isinstance(schema, dict):
        if "default" in schema:
            found.append((path, schema["default"], schema))
        for key, value in schema.items():
            if key != "default":
                found += _defaults(value, f"{path}.{key}")
    elif isinstance(schema, list):
        for index, item in enumerate(schema):
            found += _defaults(item, f"{path}[{index}]")
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_every_default_is_valid_against_its_own_schema(kind: str) -> None:
    """The API server refuses a CRD whose default breaks its schema (a default `{}` for an
    object with a required field was refused so, and no emulator saw it)."""
    document = yaml.safe_load(crd.render(kind))
    schema = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, default, where in _defaults(schema):
        errors = [e.message for e in jsonschema.Draft7Validator(where).iter_errors(default)]
        assert not errors, f"the default at {path} breaks its schema: {errors}"


def test_optional_features_are_not_defaulted_on() -> None:
    """A default for `pool` or `prewake` would put every model in a pool, or turn pre-wake on."""
    spec = crd.spec_schema()
    for name in ("pool", "prewake", "selector", "scaleTargetRef"):
        assert "default" not in spec["properties"][name], name
