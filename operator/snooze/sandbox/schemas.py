"""The OpenAPI v3 schemas of the sandbox's kinds: Kubernetes' own for built-ins, CRDs' for theirs.

The built-in schemas come from Kubernetes' published OpenAPI definitions (by way of the
kubernetes-validate package; tests/sandbox/builtin_schemas.py writes BUILTIN_FILE). A custom
resource's schema is built from its CRD as apiextensions-apiserver builds it: the version's
openAPIV3Schema, with `metadata` pointing at ObjectMeta and the kind's group-version-kind.
"""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
GVK = tuple[str, str, str]  # group, version, kind

BUILTIN_FILE = Path(__file__).with_name("builtin-schemas.json.gz")
REF_PREFIX = "#/components/schemas/"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
# What the API server says of these fields in every custom resource's schema.
API_VERSION_DESCRIPTION = (
    "APIVersion defines the versioned schema of this representation of an object. Servers should"
    " convert recognized schemas to the latest internal value, and may reject unrecognized"
    " values. More info:"
    " https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"
)
KIND_DESCRIPTION = (
    "Kind is a string value representing the REST resource this object represents. Servers may"
    " infer this from the endpoint the client submits requests to. Cannot be updated. In"
    " CamelCase. More info:"
    " https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"
)
METADATA_DESCRIPTION = (
    "Standard object's metadata. More info:"
    " https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)


@functools.cache
def builtin() -> Mapping[str, Obj]:
    """Every built-in definition by name (io.k8s.api.core.v1.Pod...), as the API server has it."""
    with gzip.open(BUILTIN_FILE, "rt") as f:
        definitions: Obj = json.load(f)["schemas"]
    return definitions


@functools.cache
def builtin_kinds() -> Mapping[GVK, str]:
    """The definition name of each built-in kind."""
    return {
        (gvk["group"], gvk["version"], gvk["kind"]): name
        for name, schema in builtin().items()
        for gvk in schema.get("x-kubernetes-group-version-kind", [])
    }


def ref_name(ref: str) -> str:
    return ref.removeprefix(REF_PREFIX)


def closure(names: list[str], definitions: Mapping[str, Obj]) -> dict[str, Obj]:
    """`names` and every definition they refer to, directly or not."""
    found: dict[str, Obj] = {}
    pending = list(names)
    while pending:
        name = pending.pop()
        if name in found or name not in definitions:
            continue
        found[name] = definitions[name]
        pending.extend(_refs(definitions[name]))
    return found


def _refs(schema: Any) -> list[str]:
    if isinstance(schema, list):
        return [ref for item in schema for ref in _refs(item)]
    if not isinstance(schema, dict):
        return []
    own = [ref_name(schema["$ref"])] if isinstance(schema.get("$ref"), str) else []
    return own + [ref for key, value in schema.items() if key != "enum" for ref in _refs(value)]


def crd_definition_name(group: str, version: str, kind: str) -> str:
    """The name a custom kind's schema has in OpenAPI documents: the group reversed, as DNS."""
    return ".".join([*reversed(group.split(".")), version, kind])


def crd_kinds(crd: Mapping[str, Any]) -> dict[str, tuple[GVK, Obj]]:
    """The schema of each served version of a CRD, by definition name, as the API server builds it.

    A version without a schema gets one that accepts any fields, as the API server gives it.
    """
    spec = crd.get("spec") or {}
    group, kind = spec.get("group", ""), (spec.get("names") or {}).get("kind", "")
    result: dict[str, tuple[GVK, Obj]] = {}
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        declared = ((version.get("schema") or {}).get("openAPIV3Schema")) or {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
        schema: Obj = json.loads(json.dumps(declared))  # a copy the caller may keep
        properties: Obj = schema.setdefault("properties", {})
        properties["apiVersion"] = {"type": "string", "description": API_VERSION_DESCRIPTION}
        properties["kind"] = {"type": "string", "description": KIND_DESCRIPTION}
        properties["metadata"] = {
            "allOf": [{"$ref": REF_PREFIX + OBJECT_META}],
            "description": METADATA_DESCRIPTION,
        }
        schema["type"] = "object"
        gvk = (group, version["name"], kind)
        schema["x-kubernetes-group-version-kind"] = [
            {"group": group, "version": version["name"], "kind": kind}
        ]
        result[crd_definition_name(*gvk)] = (gvk, schema)
    return result
