"""Generate the sandbox's schemas of the built-in kinds from kubernetes-validate's copy of them.

kubernetes-validate ships the OpenAPI definitions of each Kubernetes release, rewritten as
JSON Schema (nullable types, `$defs`, `oneOf` for Quantity and IntOrString). This turns those of
the sandbox's Kubernetes version back into the OpenAPI v3 form the API server publishes, keeps
the definitions that the kinds the sandbox serves refer to, and writes them gzipped into the
package. Run it after changing the sandbox's version or its kinds:

    python tests/sandbox/builtin_schemas.py
"""

from __future__ import annotations

import gzip
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from snooze.sandbox import discovery, schemas

# The sandbox's Kubernetes release (v1.34.0-snooze-sandbox: v1.34.0).
SOURCE = f"kubernetes-json-schema/{discovery.SERVER_VERSION['gitVersion'].split('-')[0]}-local"
REF = re.compile(r"^#/\$defs/(.+)$")
# How the API server's OpenAPI v3 spells the two scalar unions (OpenAPIV3OneOfTypes).
UNIONS = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {
        "oneOf": [{"type": "string"}, {"type": "number"}]
    },
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
        "format": "int-or-string",
        "oneOf": [{"type": "integer"}, {"type": "string"}],
    },
}


def _openapi(schema: Any) -> Any:
    """One JSON Schema node back in OpenAPI v3 form: plain types, components refs; pure."""
    if isinstance(schema, list):
        return [_openapi(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, list):
            value = next(t for t in value if t != "null")
        elif key == "$ref":
            value = schemas.REF_PREFIX + REF.match(value)[1]  # type: ignore[index]
        elif key in ("properties",):
            value = {name: _openapi(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "allOf"):
            value = _openapi(value)
        result[key] = value
    return result


def _refs(schema: Any) -> set[str]:
    text = json.dumps(schema)
    return set(re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', text))


def generate() -> dict[str, Any]:
    """The definitions of the built-in kinds the sandbox serves, and all they refer to."""
    path = resources.files("kubernetes_validate") / SOURCE / "_definitions.json"
    definitions = json.loads(path.read_text())["$defs"]
    converted: dict[str, Any] = {}
    for name, schema in definitions.items():
        openapi = _openapi(schema)
        if name in UNIONS:
            openapi = {k: v for k, v in openapi.items() if k != "oneOf"} | UNIONS[name]
        for field in ("apiVersion", "kind"):
            # kubernetes-validate pins these with an enum; the API server's schemas do not.
            if "x-kubernetes-group-version-kind" in openapi and field in openapi["properties"]:
                openapi["properties"][field].pop("enum", None)
        converted[name] = openapi
    kinds = {
        (gvk["group"], gvk["version"], gvk["kind"]): name
        for name, schema in converted.items()
        for gvk in schema.get("x-kubernetes-group-version-kind", [])
    }
    wanted = [
        kinds[spec.group, spec.version, spec.kind]
        for spec in discovery.bundled_specs()
        if (spec.group, spec.version, spec.kind) in kinds
    ] + ["io.k8s.apimachinery.pkg.apis.meta.v1.Patch"]  # the body of every PATCH
    kept: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name not in kept:
            kept.add(name)
            wanted.extend(_refs(converted[name]))
    return {
        "source": f"kubernetes-validate {SOURCE}",
        "schemas": {name: converted[name] for name in sorted(kept)},
    }


def write(target: Path = schemas.BUILTIN_FILE) -> None:
    text = json.dumps(generate(), sort_keys=True, separators=(",", ":")).encode()
    target.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))


if __name__ == "__main__":
    write()
    print(f"wrote {schemas.BUILTIN_FILE}")
