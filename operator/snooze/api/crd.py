"""Render the CRDs (InferenceModel, GPUPool) from the pydantic models as structural schemas."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml
from pydantic import BaseModel

from snooze.api import gpupool, models, modelstatus

JSON = dict[str, Any]

# Keys of pydantic's JSON Schema that a structural schema does not take, or that only help
# pydantic's own documents.
_DROP_KEYS = {"title", "$defs", "examples", "example"}


def _inline(schema: Any, defs: JSON) -> Any:
    """Replace every `$ref` by the definition it names: structural schemas allow no refs."""
    if isinstance(schema, list):
        return [_inline(item, defs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        merged = {**_inline(defs[name], defs), **{k: v for k, v in schema.items() if k != "$ref"}}
        return _inline(merged, defs)
    return {key: _inline(value, defs) for key, value in schema.items() if key not in _DROP_KEYS}


def _structural(schema: Any) -> Any:
    """Turn pydantic's JSON Schema into the OpenAPI v3 subset that Kubernetes calls structural."""
    if isinstance(schema, list):
        return [_structural(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = dict(schema)
    # `X | None` comes out as anyOf [X, null]: optional already means "may be absent".
    options = schema.get("anyOf")
    if options is not None:
        kept = [option for option in options if option.get("type") != "null"]
        if len(kept) == 1:
            del schema["anyOf"]
            schema = {**kept[0], **schema}
    # A date-time is a string with a format in OpenAPI.
    if schema.get("format") == "date-time":
        schema["type"] = "string"
    # Literal[1, 2] gives `enum` with a `type` only when pydantic can infer it.
    if "enum" in schema and "type" not in schema:
        values = schema["enum"]
        schema["type"] = "integer" if all(isinstance(v, int) for v in values) else "string"
    if "const" in schema:
        schema["enum"] = [schema.pop("const")]
    if schema.get("type") == "object" and schema.get("additionalProperties") is False:
        # Properties and additionalProperties are mutually exclusive in a structural schema;
        # the API server prunes unknown fields instead (and refuses them under kubectl's
        # default strict field validation).
        del schema["additionalProperties"]
    if schema.get("default") is None and "default" in schema:
        del schema["default"]
    return {key: _structural(value) for key, value in schema.items()}


def _object_schema(model: type[BaseModel]) -> JSON:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return dict(_structural(_inline(raw, raw.get("$defs", {}))))


def _selector_constraints(spec: JSON) -> None:
    """Say in the schema what the pydantic validator says: a selector may not be empty."""
    selector = spec["properties"]["selector"]
    selector["anyOf"] = [{"required": ["matchLabels"]}, {"required": ["matchExpressions"]}]
    selector["properties"]["matchLabels"]["minProperties"] = 1
    selector["properties"]["matchExpressions"]["minItems"] = 1
    for name in ("matchLabels", "matchExpressions"):
        selector["properties"][name].pop("default", None)
    requirement = selector["properties"]["matchExpressions"]["items"]
    requirement["properties"]["values"].pop("default", None)


def _object_defaults(spec: JSON) -> None:
    """Default nested objects to `{}`, so that the API server fills in their fields' defaults;
    not the optional ones (`pool`, `prewake`): a default there would turn them on for every
    model, and the API server refuses a CRD whose default lacks a required field."""
    fields = models.InferenceModelSpec.model_fields
    for name, prop in spec["properties"].items():
        field = next((f for key, f in fields.items() if (f.alias or key) == name), None)
        optional = field is None or field.default is None
        required = name in ("selector", "scaleTargetRef")
        if prop.get("type") == "object" and not optional and not required:
            prop["default"] = {}


def _ordered(schema: Any) -> Any:
    """type and description first: that is how a person reads a schema."""
    if isinstance(schema, list):
        return [_ordered(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    first = [key for key in ("type", "description") if key in schema]
    rest = [key for key in schema if key not in first]
    return {key: _ordered(schema[key]) for key in first + rest}


# Rules across fields, in CEL: the API server refuses what breaks them, as the models do.
SPEC_RULES: list[JSON] = [
    {
        "rule": "!has(self.scaleToZeroAfter) || has(self.scaleTargetRef)",
        "message": "scaleToZeroAfter needs scaleTargetRef: name the Deployment or "
        "StatefulSet to scale",
        "fieldPath": ".scaleToZeroAfter",
    },
    {
        "rule": "!has(self.scaleToZeroAfter) || self.idle.after != 'Never'",
        "message": "scaleToZeroAfter needs idle.after to be a duration, not Never: engines "
        "sleep first, then scale to zero",
        "fieldPath": ".scaleToZeroAfter",
    },
    {
        "rule": "!has(self.scaleToZeroAfter) || self.idle.after == 'Never' || "
        "self.idle.after == 'Auto' || "
        "duration(self.idle.after) < duration(self.scaleToZeroAfter)",
        "message": "scaleToZeroAfter must be longer than idle.after: engines sleep first, "
        "then scale to zero",
        "fieldPath": ".scaleToZeroAfter",
    },
    {
        "rule": "!has(self.scaleToZeroAfter) || self.idle.after != 'Auto' || "
        "!has(self.idle.auto) || !has(self.idle.auto.max) || "
        "duration(self.idle.auto.max) < duration(self.scaleToZeroAfter)",
        "message": "scaleToZeroAfter must be longer than idle.auto.max: engines sleep first, "
        "then scale to zero",
        "fieldPath": ".scaleToZeroAfter",
    },
]


def spec_schema() -> JSON:
    spec = _object_schema(models.InferenceModelSpec)
    _selector_constraints(spec)
    _object_defaults(spec)
    spec["x-kubernetes-validations"] = SPEC_RULES
    return dict(_ordered(spec))


def status_schema() -> JSON:
    status = _object_schema(modelstatus.InferenceModelStatus)
    # Status is written by the operator alone; defaults would only hide what it has not said.
    _strip_defaults(status)
    _conditions_by_type(status)
    return dict(_ordered(status))


def pool_status_schema() -> JSON:
    status = _object_schema(gpupool.GPUPoolStatus)
    _strip_defaults(status)
    _conditions_by_type(status)
    return dict(_ordered(status))


def _conditions_by_type(status: JSON) -> None:
    # One condition per type, merged by type, as metav1.Condition lists are (+listType=map).
    conditions = status["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]


def _strip_defaults(schema: Any) -> None:
    if isinstance(schema, dict):
        schema.pop("default", None)
        for value in schema.values():
            _strip_defaults(value)
    elif isinstance(schema, list):
        for item in schema:
            _strip_defaults(item)


def _openapi(description: str, kind: str, spec: JSON, status: JSON) -> JSON:
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": models.API_VERSION},
            "kind": {"type": "string", "description": kind},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def openapi_schema() -> JSON:
    """The `openAPIV3Schema` of the InferenceModel CRD."""
    return _openapi(
        "An InferenceModel tells Snooze which pods serve a vLLM model, when their engines "
        "sleep and how they wake.",
        models.KIND,
        spec_schema(),
        status_schema(),
    )


def pool_openapi_schema() -> JSON:
    """The `openAPIV3Schema` of the GPUPool CRD."""
    spec = _object_schema(gpupool.GPUPoolSpec)
    return _openapi(
        "A GPUPool is one GPU that several models' engines share: Snooze keeps awake what fits "
        "in its memory and makes room on demand.",
        gpupool.KIND,
        dict(_ordered(spec)),
        pool_status_schema(),
    )


def printer_columns() -> list[JSON]:
    return [
        {"name": "Model", "type": "string", "jsonPath": ".status.modelName"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Awake", "type": "integer", "jsonPath": ".status.awake"},
        {"name": "Asleep", "type": "integer", "jsonPath": ".status.asleep"},
        {"name": "Last Wake", "type": "date", "jsonPath": ".status.lastWakeTime"},
        {
            "name": "Wake Seconds",
            "type": "number",
            "jsonPath": ".status.lastWakeSeconds",
            "priority": 1,
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def pool_printer_columns() -> list[JSON]:
    return [
        {"name": "Memory", "type": "string", "jsonPath": ".spec.memory"},
        {"name": "Used", "type": "string", "jsonPath": ".status.used"},
        {"name": "Awake", "type": "integer", "jsonPath": ".status.awake"},
        {"name": "Waiting", "type": "integer", "jsonPath": ".status.waiting"},
        {"name": "Evictions", "type": "integer", "jsonPath": ".status.evictions"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def _crd(
    *,
    kind: str,
    plural: str,
    singular: str,
    short_names: list[str],
    schema: JSON,
    columns: list[JSON],
) -> JSON:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{models.GROUP}"},
        "spec": {
            "group": models.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": short_names,
                "categories": ["snooze"],
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def crd() -> JSON:
    """The InferenceModel CustomResourceDefinition."""
    return _crd(
        kind=models.KIND,
        plural=models.PLURAL,
        singular=models.SINGULAR,
        short_names=models.SHORT_NAMES,
        schema=openapi_schema(),
        columns=printer_columns(),
    )


def pool_crd() -> JSON:
    """The GPUPool CustomResourceDefinition."""
    return _crd(
        kind=gpupool.KIND,
        plural=gpupool.PLURAL,
        singular=gpupool.SINGULAR,
        short_names=gpupool.SHORT_NAMES,
        schema=pool_openapi_schema(),
        columns=pool_printer_columns(),
    )


# Each CRD by kind, in the order `snooze crd` prints them; file names in crds/ follow.
CRDS = {models.KIND: crd, gpupool.KIND: pool_crd}


def file_name(kind: str) -> str:
    """The file in crds/ (and the chart's crds/) that holds the CRD of `kind`."""
    body = CRDS[kind]()
    return f"{body['metadata']['name']}.yaml"


class _Dumper(yaml.SafeDumper):
    """Block-style YAML with long descriptions kept readable."""


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_presenter)


def render(kind: str = models.KIND) -> str:
    """One CRD as the YAML checked in at crds/ (see file_name)."""
    source = "gpupool.py" if kind == gpupool.KIND else "models.py"
    header = (
        f"# Generated by `snooze crd --kind {kind}` from operator/snooze/api/{source}: "
        "do not edit by hand.\n"
    )
    body = yaml.dump(CRDS[kind](), Dumper=_Dumper, sort_keys=False, width=100)
    return header + body


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kind",
        choices=[*CRDS, "all"],
        default="all",
        help="which CRD to print (default: all, as separate YAML documents)",
    )
    parser.epilog = "Apply them with: snooze crd | kubectl apply -f -"


def run(args: argparse.Namespace) -> int:
    kinds = list(CRDS) if args.kind == "all" else [args.kind]
    sys.stdout.write("---\n".join(render(kind) for kind in kinds))
    return 0
