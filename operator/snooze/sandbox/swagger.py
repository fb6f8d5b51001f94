"""The OpenAPI v2 document at /openapi/v2: JSON, or the protobuf form that kubectl asks for.

kubectl falls back to v2 where v3 does not answer, and `kubectl explain --output
plaintext-openapiv2` reads it. It is derived from the v3 documents, as the API server derives
both from one source: Swagger 2.0 names schemas `#/definitions/...`, takes request bodies as
`body` parameters, and knows no oneOf, anyOf or nullable. The protobuf form is gnostic's
openapi_v2.Document (github.com/google/gnostic, OpenAPIv2.proto), encoded here by hand.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from snooze.sandbox import schemas

Obj = dict[str, Any]
# What kubectl asks for is ...spec.v2@v1.0+protobuf; Go's mime parser refuses the "@" in a
# Content-Type, so the API server answers with this spelling.
PROTOBUF = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
V2_PREFIX = "#/definitions/"


# -- From the v3 documents -----------------------------------------------------------------------


def schema_v2(schema: Any) -> Any:
    """A v3 schema as Swagger 2.0 says it; pure."""
    if not isinstance(schema, dict):
        return schema
    all_of = schema.get("allOf") or []
    if len(all_of) == 1 and set(all_of[0]) == {"$ref"}:
        # Swagger 2.0 tools read a $ref beside its description, not inside allOf.
        schema = {k: v for k, v in schema.items() if k != "allOf"} | all_of[0]
    result: Obj = {}
    for key, value in schema.items():
        if key in ("anyOf", "oneOf", "not", "nullable"):
            continue
        if key == "$ref":
            value = V2_PREFIX + schemas.ref_name(value)
        elif key == "properties":
            value = {name: schema_v2(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties"):
            value = schema_v2(value)
        elif key == "allOf":
            value = [schema_v2(sub) for sub in value]
        result[key] = value
    if schema.get("oneOf") and "type" not in result:
        result["type"] = "string"  # IntOrString and Quantity, as v2 has always spelt them
    return result


def operation_v2(operation: Obj) -> Obj:
    """A v3 operation as Swagger 2.0 says it: its body and query parameters, its response."""
    parameters = [
        {k: v for k, v in p.items() if k != "schema"} | {"type": p["schema"]["type"]}
        | ({"uniqueItems": True} if p["schema"].get("uniqueItems") else {})
        for p in operation.get("parameters", [])
    ]  # fmt: skip
    result: Obj = {k: v for k, v in operation.items() if k in ("description", "operationId")}
    body = operation.get("requestBody")
    if body:
        result["consumes"] = list(body["content"])
        schema = next(iter(body["content"].values()))["schema"]
        parameters.insert(0, {"name": "body", "in": "body", "required": True,
                              "schema": schema_v2(schema)})  # fmt: skip
    result["produces"] = ["application/json"]
    result["parameters"] = parameters
    result["responses"] = {
        code: {
            "description": response["description"],
            "schema": schema_v2(response["content"]["application/json"]["schema"]),
        }
        for code, response in operation["responses"].items()
    }
    return result | {k: v for k, v in operation.items() if k.startswith("x-")}


def document(group_versions: list[Obj], version: str) -> Obj:
    """The Swagger 2.0 document of all the given group-version documents (v3); pure."""
    paths: Obj = {}
    definitions: Obj = {}
    for doc in group_versions:
        for path, item in doc["paths"].items():
            paths[path] = {method: operation_v2(op) for method, op in item.items()}
        for name, schema in doc["components"]["schemas"].items():
            definitions[name] = schema_v2(schema)
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": version},
        "paths": dict(sorted(paths.items())),
        "definitions": dict(sorted(definitions.items())),
    }


# -- Protobuf wire format ------------------------------------------------------------------------


def _varint(number: int) -> bytes:
    number &= (1 << 64) - 1  # negative int64s are ten bytes of two's complement
    out = bytearray()
    while True:
        low, number = number & 0x7F, number >> 7
        out.append(low | (0x80 if number else 0))
        if not number:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field: a string, bytes, or an embedded message."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _text(number: int, value: Any) -> bytes:
    return _field(number, str(value).encode()) if value not in (None, "") else b""


def _flag(number: int, value: Any, *, always: bool = False) -> bytes:
    return _varint(number << 3) + _varint(int(bool(value))) if value or always else b""


def _integer(number: int, value: Any) -> bytes:
    return _varint(number << 3) + _varint(int(value)) if value else b""


def _double(number: int, value: Any) -> bytes:
    return _varint(number << 3 | 1) + struct.pack("<d", float(value)) if value else b""


def _any(number: int, value: Any) -> bytes:
    """An openapi_v2.Any: its `yaml` field (JSON is YAML) holds the value."""
    return _field(number, _text(2, json.dumps(value)))


def _named(number: int, name: str, value: bytes) -> bytes:
    return _field(number, _text(1, name) + _field(2, value))


# Scalar fields of openapi_v2.Schema, by JSON name.
_SCHEMA_TEXT = {"$ref": 1, "format": 2, "title": 3, "description": 4, "pattern": 13}
_SCHEMA_DOUBLE = {"multipleOf": 6, "maximum": 7, "minimum": 9}
_SCHEMA_FLAG = {"exclusiveMaximum": 8, "exclusiveMinimum": 10, "uniqueItems": 16, "readOnly": 27}
_SCHEMA_INTEGER = {"maxLength": 11, "minLength": 12, "maxItems": 14, "minItems": 15,
                   "maxProperties": 17, "minProperties": 18}  # fmt: skip


def encode_schema(schema: Obj) -> bytes:
    out = []
    for key, value in schema.items():
        if key in _SCHEMA_TEXT:
            out.append(_text(_SCHEMA_TEXT[key], value))
        elif key in _SCHEMA_DOUBLE:
            out.append(_double(_SCHEMA_DOUBLE[key], value))
        elif key in _SCHEMA_FLAG:
            out.append(_flag(_SCHEMA_FLAG[key], value))
        elif key in _SCHEMA_INTEGER:
            out.append(_integer(_SCHEMA_INTEGER[key], value))
        elif key in ("default", "example"):
            out.append(_any(5 if key == "default" else 30, value))
        elif key == "required":
            out += [_text(19, name) for name in value]
        elif key == "enum":
            out += [_any(20, item) for item in value]
        elif key == "additionalProperties":
            item = _field(1, encode_schema(value)) if isinstance(value, dict) else None
            out.append(_field(21, item if item is not None else _flag(2, value, always=True)))
        elif key == "type":
            out.append(
                _field(
                    22,
                    b"".join(_text(1, t) for t in ([value] if isinstance(value, str) else value)),
                )
            )
        elif key == "items" and isinstance(value, dict):
            out.append(_field(23, _field(1, encode_schema(value))))
        elif key == "allOf":
            out += [_field(24, encode_schema(sub)) for sub in value]
        elif key == "properties":
            props = b"".join(_named(1, name, encode_schema(sub)) for name, sub in value.items())
            out.append(_field(25, props))
        elif key.startswith("x-"):
            out.append(_named(31, key, _text(2, json.dumps(value))))
    return b"".join(out)


def _parameter(parameter: Obj) -> bytes:
    """An openapi_v2.ParametersItem: a body parameter, or a query one (NonBodyParameter)."""
    if parameter["in"] == "body":
        body = (_text(2, parameter["name"]) + _text(3, "body") + _flag(4, parameter["required"])
                + _field(5, encode_schema(parameter["schema"])))  # fmt: skip
        return _field(1, _field(1, body))
    query = (_flag(1, parameter.get("required")) + _text(2, "query")
             + _text(3, parameter.get("description")) + _text(4, parameter["name"])
             + _text(6, parameter["type"]) + _flag(20, parameter.get("uniqueItems")))  # fmt: skip
    return _field(1, _field(2, _field(3, query)))


def _operation(operation: Obj) -> bytes:
    out = [_text(3, operation.get("description")), _text(5, operation.get("operationId"))]
    out += [_text(6, media) for media in operation.get("produces", [])]
    out += [_text(7, media) for media in operation.get("consumes", [])]
    out += [_field(8, _parameter(p)) for p in operation["parameters"]]
    responses = b"".join(
        _named(
            1,
            code,
            _field(
                1, _text(1, r["description"]) + _field(2, _field(1, encode_schema(r["schema"])))
            ),
        )
        for code, r in operation["responses"].items()
    )
    out.append(_field(9, responses))
    out += [
        _named(13, k, _text(2, json.dumps(v))) for k, v in operation.items() if k.startswith("x-")
    ]
    return b"".join(out)


_METHODS = {"get": 2, "put": 3, "post": 4, "delete": 5, "patch": 8}


def encode(doc: Obj) -> bytes:
    """The openapi_v2.Document of a Swagger 2.0 document, as protobuf bytes."""
    info = _text(1, doc["info"]["title"]) + _text(2, doc["info"]["version"])
    paths = b"".join(
        _named(2, path, b"".join(_field(_METHODS[m], _operation(op)) for m, op in item.items()))
        for path, item in doc["paths"].items()
    )
    definitions = b"".join(
        _named(1, name, encode_schema(schema)) for name, schema in doc["definitions"].items()
    )
    return _text(1, doc["swagger"]) + _field(2, info) + _field(8, paths) + _field(9, definitions)
