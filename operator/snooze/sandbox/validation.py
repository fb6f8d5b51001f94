"""What the API server checks of an object it is asked to store, against the kind's schema.

Unknown fields are refused, reported or dropped as the request's `fieldValidation` says
(Strict, Warn, the default, or Ignore); they are never stored, as the API server decodes
built-ins into their types and prunes custom resources. A value of the wrong type is refused
always: for a built-in as the decoder refuses it (400), for a custom resource as the CRD's
schema refuses it (422), along with the schema's other value rules (required, enum, bounds,
lengths, patterns, item counts). A CRD whose defaults break its own schema is refused. CRD
validation rules in CEL are not evaluated.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from snooze.sandbox import schemas
from snooze.sandbox.api import ApiError
from snooze.sandbox.discovery import ResourceSpec

Obj = dict[str, Any]
DIRECTIVES = ("Strict", "Warn", "Ignore")
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array"}
# How Go's JSON decoder names a value's kind in its errors.
GO_KINDS = {"integer": "number", "boolean": "bool"}
# The metav1.CauseType of each kind of field error, by the words its message starts with.
CAUSES = {
    "Required value": "FieldValueRequired",
    "Unsupported value": "FieldValueNotSupported",
    "Too long": "FieldValueTooLong",
    "Too many": "FieldValueTooMany",
}


def directive(query: Mapping[str, str]) -> str:
    """The request's fieldValidation, Warn when absent; 400 for anything else, as the API server."""
    value = query.get("fieldValidation") or "Warn"
    if value not in DIRECTIVES:
        raise ApiError(
            400,
            f"fieldValidation: Unsupported value: {json.dumps(value)}:"
            ' supported values: "Ignore", "Strict", "Warn"',
        )
    return value


def json_type(value: Any) -> str:
    return "object" if isinstance(value, dict) else JSON_TYPES.get(type(value), "null")


@dataclass(kw_only=True)
class Findings:
    """What one walk over an object found: unknown fields, decoder errors, schema violations."""

    unknown: list[str] = field(default_factory=list)
    decoding: list[str] = field(default_factory=list)
    invalid: list[tuple[str, str]] = field(default_factory=list)  # field, what is wrong


@dataclass(kw_only=True)
class Walker:
    """Walks an object along its schema; `custom` applies a CRD's rules rather than a decoder's."""

    definitions: Mapping[str, Obj]
    custom: bool
    findings: Findings = field(default_factory=Findings)

    def _resolve(self, schema: Obj) -> tuple[Obj, str]:
        name = ""
        while True:
            if isinstance(schema.get("$ref"), str):
                name = schemas.ref_name(schema["$ref"])
            elif len(schema.get("allOf") or ()) == 1 and "$ref" in schema["allOf"][0]:
                name = schemas.ref_name(schema["allOf"][0]["$ref"])
            else:
                return schema, name
            schema = self.definitions.get(name, {})

    def walk(self, value: Any, schema: Obj, path: str, go: tuple[str, str]) -> None:
        """Check `value` at `path`; `go` is the Go struct and field path a decoder would name."""
        schema, name = self._resolve(schema)
        if value is None:
            return  # a decoder takes null as the zero value; a CRD prunes or allows it
        expected = schema.get("type")
        if not self._type_fits(value, schema, name):
            self._wrong_type(value, schema, name, path, go)
            return
        if name and schema.get("properties") is not None:
            go = (name.rsplit(".", 1)[-1], go[1])  # Go names the innermost struct, the full path
        if self.custom:
            self._rules(value, schema, path)
        if isinstance(value, dict) and expected in ("object", None):
            self._fields(value, schema, path, go, builtin_type=bool(name))
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for index, item in enumerate(value):
                self.walk(item, schema["items"], f"{path}[{index}]", go)

    def _fields(
        self, value: Obj, schema: Obj, path: str, go: tuple[str, str], *, builtin_type: bool
    ) -> None:
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        keep = schema.get("x-kubernetes-preserve-unknown-fields") or extra is True
        embedded = schema.get("x-kubernetes-embedded-resource")
        for key in list(value):
            where = f"{path}.{key}" if path else key
            at = (go[0], f"{go[1]}.{key}" if go[1] else key)
            if properties is not None and key in properties:
                self.walk(value[key], properties[key], where, at)
            elif isinstance(extra, dict):
                self.walk(value[key], extra, where, go)  # Go's path names no map key
            elif keep or (embedded and key in ("apiVersion", "kind", "metadata")):
                continue
            # A CRD's object without properties keeps no field; a built-in one (FieldsV1...) any.
            elif properties is not None or (self.custom and extra is None and not builtin_type):
                self.findings.unknown.append(where)
                del value[key]  # never stored: the decoder drops it, pruning removes it

    def _type_fits(self, value: Any, schema: Obj, name: str) -> bool:
        actual = json_type(value)
        if name == QUANTITY:
            return actual in ("string", "integer", "number")
        if schema.get("format") == "int-or-string" or schema.get("x-kubernetes-int-or-string"):
            return actual in ("string", "integer")
        expected = schema.get("type")
        if expected is None or expected == actual:
            return True
        if expected == "number":
            return actual == "integer"
        # A CRD's integer may be written 2.0; a decoder into int64 refuses it.
        return self.custom and expected == "integer" and actual == "number" and value.is_integer()

    def _wrong_type(
        self, value: Any, schema: Obj, name: str, path: str, go: tuple[str, str]
    ) -> None:
        actual = json_type(value)
        if self.custom:
            expected = schema.get("type")
            message = f"{path} in body must be of type {expected}: {json.dumps(actual)}"
            self.findings.invalid.append((path, f"Invalid value: {json.dumps(actual)}: {message}"))
            return
        self.findings.decoding.append(
            f"json: cannot unmarshal {GO_KINDS.get(actual, actual)} into Go struct field"
            f" {go[0]}.{go[1]} of type {self._go_type(schema, name)}"
        )

    def _go_type(self, schema: Obj, name: str) -> str:
        if name in (QUANTITY, INT_OR_STRING):
            return ".".join(name.rsplit(".", 2)[-2:])
        if name and schema.get("properties") is not None:
            package, kind = name.rsplit(".", 2)[-2:]
            return f"{package}.{kind}"
        expected = schema.get("type")
        if expected == "array" and isinstance(schema.get("items"), dict):
            return "[]" + self._go_type(*self._resolve(schema["items"]))
        if expected == "object" and isinstance(schema.get("additionalProperties"), dict):
            return "map[string]" + self._go_type(*self._resolve(schema["additionalProperties"]))
        scalars = {"string": "string", "boolean": "bool", "number": "float64"}
        if expected == "integer":
            return "int32" if schema.get("format") == "int32" else "int64"
        return scalars.get(str(expected), "interface {}")

    def _rules(self, value: Any, schema: Obj, path: str) -> None:
        """A CRD schema's value rules, with the API server's words for each failure."""
        shown = json.dumps(json_type(value) if isinstance(value, dict | list) else value)
        problems: list[str] = []
        if "enum" in schema and value not in schema["enum"]:
            allowed = ", ".join(f'"{v}"' if not isinstance(v, str) else json.dumps(v)
                                for v in schema["enum"])  # fmt: skip
            problems.append(f"Unsupported value: {shown}: supported values: {allowed}")
        if isinstance(value, int | float) and not isinstance(value, bool):
            for key, word, sign in (("minimum", "greater than", 1), ("maximum", "less than", -1)):
                if key in schema:
                    exclusive = schema.get(f"exclusive{key.capitalize()}")
                    limit = schema[key]
                    if sign * (value - limit) < 0 or (exclusive and value == limit):
                        bound = word if exclusive else f"{word} or equal to"
                        problems.append(
                            f"Invalid value: {shown}: {path} in body should be {bound} {limit}"
                        )
        if isinstance(value, str):
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                problems.append(f"Too long: may not be more than {schema['maxLength']} bytes")
            if "minLength" in schema and len(value) < schema["minLength"]:
                problems.append(
                    f"Invalid value: {shown}: {path} in body should be at least"
                    f" {schema['minLength']} chars long"
                )
            if "pattern" in schema and not re.search(schema["pattern"], value):
                problems.append(
                    f"Invalid value: {shown}: {path} in body should match '{schema['pattern']}'"
                )
        if isinstance(value, list):
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                problems.append(
                    f"Too many: {len(value)}: must have at most {schema['maxItems']} items"
                )
            if "minItems" in schema and len(value) < schema["minItems"]:
                problems.append(
                    f"Invalid value: {len(value)}: {path} in body should have at least"
                    f" {schema['minItems']} items"
                )
        self.findings.invalid.extend((path, problem) for problem in problems)
        if isinstance(value, dict):
            for key in schema.get("required") or ():
                if key not in value or value[key] is None:
                    self.findings.invalid.append(
                        (f"{path}.{key}" if path else key, "Required value")
                    )
        for branch in schema.get("allOf") or ():
            if "$ref" not in branch:
                self._rules(value, branch, path)
        if schema.get("anyOf") and not any(self._passes(value, b, path) for b in schema["anyOf"]):
            self.findings.invalid.append(
                (
                    path,
                    f"Invalid value: {shown}: {path} in body must validate at least one schema"
                    " (anyOf)",
                )
            )
            self._rules(value, schema["anyOf"][0], path)

    def _passes(self, value: Any, schema: Obj, path: str) -> bool:
        probe = Walker(definitions=self.definitions, custom=True)
        probe._rules(value, schema, path)
        return not probe.findings.invalid


@dataclass(kw_only=True)
class Check:
    """The checks of one write request: its fieldValidation, and the warnings it collects."""

    kind: str
    group: str
    version: str
    schema: Obj | None  # None: a kind the sandbox has no schema for (nothing checked)
    custom: bool
    directive: str = "Warn"
    patch: bool = False
    warnings: list[str] = field(default_factory=list)

    def __call__(self, obj: Obj) -> None:
        """Check `obj` before it is stored, dropping unknown fields; raises ApiError if refused."""
        if self.schema is None:
            return
        definitions = schemas.builtin()
        walker = Walker(definitions=definitions, custom=self.custom)
        walker.walk(obj, self.schema, "", (self.kind, ""))
        found = walker.findings
        name = (obj.get("metadata") or {}).get("name", "")
        handled = f'{self.kind} in version "{self.version}" cannot be handled as a {self.kind}: '
        if found.decoding:
            raise ApiError(400, handled + found.decoding[0])
        if found.unknown and self.directive == "Strict":
            strict = "strict decoding error: " + ", ".join(
                f"unknown field {json.dumps(path)}" for path in found.unknown
            )
            raise ApiError(400, strict if self.patch else handled + strict)
        if self.directive == "Warn":
            self.warnings += [f"unknown field {json.dumps(path)}" for path in found.unknown]
        if found.invalid:
            raise invalid(self.kind, self.group, name, found.invalid)


def invalid(kind: str, group: str, name: str, problems: list[tuple[str, str]]) -> ApiError:
    """The 422 Invalid Status with one cause per problem, as the API server words it."""
    errors = [f"{where}: {what}" if where else what for where, what in problems]
    listed = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    resource = f"{kind}.{group}" if group else kind
    causes = [
        {
            "reason": next(
                (c for w, c in CAUSES.items() if what.startswith(w)), "FieldValueInvalid"
            ),
            "message": what,
            "field": where,
        }
        for where, what in problems
    ]
    return ApiError(
        422,
        f'{resource} "{name}" is invalid: {listed}',
        details={"name": name, "group": group, "kind": kind, "causes": causes},
    )


def check_for(spec: ResourceSpec, query: Mapping[str, str], *, method: str) -> Check:
    """The checks of a request to `spec`; only writes read (and refuse a bad) fieldValidation."""
    if spec.custom:
        schema = spec.schema
    else:
        name = schemas.builtin_kinds().get((spec.group, spec.version, spec.kind))
        schema = schemas.builtin()[name] if name else None
    return Check(
        kind=spec.kind,
        group=spec.group,
        version=spec.version,
        schema=dict(schema) if schema is not None else None,
        custom=spec.custom,
        directive=directive(query) if method in ("POST", "PUT", "PATCH") else "Warn",
        patch=method == "PATCH",
    )


# Writes the sandbox makes itself (scale), which no schema check applies to.
NO_CHECK = Check(kind="", group="", version="", schema=None, custom=False)


def check_crd_defaults(crd: Obj, name: str) -> None:
    """Refuse a CRD whose schema defaults a field to a value its own schema refuses, as the API
    server does (a default `{}` for an object with a required field, a number for a string)."""
    problems: list[tuple[str, str]] = []
    for index, version in enumerate((crd.get("spec") or {}).get("versions") or []):
        schema = ((version or {}).get("schema") or {}).get("openAPIV3Schema")
        if isinstance(schema, dict):
            where = f"spec.versions[{index}].schema.openAPIV3Schema"
            problems += _bad_defaults(schema, where)
    if problems:
        raise invalid("CustomResourceDefinition", "apiextensions.k8s.io", name, problems)


def _bad_defaults(schema: Obj, path: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    if "default" in schema:
        walker = Walker(definitions={}, custom=True)
        walker.walk(copy.deepcopy(schema["default"]), schema, f"{path}.default", ("", ""))
        found += walker.findings.invalid
    for key, sub in (schema.get("properties") or {}).items():
        if isinstance(sub, dict):
            found += _bad_defaults(sub, f"{path}.properties[{key}]")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += _bad_defaults(schema[key], f"{path}.{key}")
    return found
