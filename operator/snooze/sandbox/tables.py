"""The Tables that kubectl asks for: CRD printer columns, built-in printers, or NAME and AGE."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from snooze.sandbox import jsonpath, printers
from snooze.sandbox.api import ApiError
from snooze.sandbox.discovery import PrinterColumn, ResourceSpec

Obj = dict[str, Any]

NAME_DESCRIPTION = "Name must be unique within a namespace."
AGE_DESCRIPTION = "When the object was created."
# What a CRD without additionalPrinterColumns shows after NAME, as apiextensions-apiserver does.
DEFAULT_CRD_COLUMNS = (
    PrinterColumn(
        name="Age",
        type="date",
        json_path=".metadata.creationTimestamp",
        description=AGE_DESCRIPTION,
    ),
)


# What a Table row carries besides its cells (metav1.IncludeObjectPolicy); Metadata by default.
INCLUDE_OBJECT = ("Object", "Metadata", "None")


@dataclass(frozen=True, kw_only=True)
class TableRequest:
    """A request's `Accept: application/json;as=Table;v=...;g=meta.k8s.io` and its TableOptions."""

    api_version: str = "meta.k8s.io/v1"
    include_object: str = "Metadata"


def requested(accept: str, query: Mapping[str, str]) -> TableRequest | None:
    """The Table a request asks for, or None for plain JSON: the first type it accepts; pure."""
    for media_range in accept.split(","):
        media, *params = (part.strip() for part in media_range.split(";"))
        options = dict(p.split("=", 1) for p in params if "=" in p)
        if "as" not in options and media in ("application/json", "application/*", "*/*"):
            return None
        if options.get("as") == "Table" and options.get("g") == "meta.k8s.io":
            if options.get("v") not in ("v1", "v1beta1"):
                continue
            include = query.get("includeObject") or "Metadata"
            if include not in INCLUDE_OBJECT:
                raise ApiError(400, f'unrecognized includeObject value: "{include}"')
            return TableRequest(api_version=f"meta.k8s.io/{options['v']}", include_object=include)
    return None


def watch_renderer(spec: ResourceSpec, request: TableRequest | None) -> Callable[[Obj], Obj]:
    """How a watch sends each event: as stored, or as a one-row Table if it asked for Tables.

    Like the API server's watch encoder, only the first Table carries the column definitions
    (kubectl reuses them for the following rows); error events (a Status) are sent as they are.
    """
    if request is None:
        return lambda event: event
    first = True

    def render(event: Obj) -> Obj:
        nonlocal first
        if event["type"] == "ERROR":
            return event
        obj = event["object"]
        meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
        rendered = table(spec, [obj], meta, request, headers=first)
        first = False
        return {"type": event["type"], "object": rendered}

    return render


def _row_object(obj: Obj, request: TableRequest) -> Obj | None:
    """What a row carries: the object, its metadata as PartialObjectMetadata, or nothing."""
    if request.include_object == "Object":
        return obj
    if request.include_object == "None":
        return None
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": request.api_version,
        "metadata": obj.get("metadata", {}),
    }


def table(
    spec: ResourceSpec,
    items: list[Obj],
    meta: Obj,
    request: TableRequest | None = None,
    *,
    headers: bool = True,
) -> Obj:
    """The Table of `items` as the API server renders it (without the columns if not `headers`)."""
    request = request or TableRequest()
    builtin = None if spec.custom else printers.BUILTIN.get((spec.group, spec.plural))
    if builtin is not None:
        columns, cells_of = builtin
        definitions = [_definition(name, type_, priority) for name, type_, priority in columns]
        rows = [{"cells": cells_of(obj), "object": _row_object(obj, request)} for obj in items]
    else:
        custom = (
            (spec.printer_columns or DEFAULT_CRD_COLUMNS) if spec.custom else DEFAULT_CRD_COLUMNS
        )
        definitions = [_definition("Name", "string", 0)] + [
            _definition(c.name, c.type, c.priority, c.format, c.description or _described(c))
            for c in custom
        ]
        paths = [_compile(c.json_path) for c in custom]
        rows = [
            {
                "cells": [obj["metadata"].get("name", "")]
                + [_cell(c.type, path, obj) for c, path in zip(custom, paths, strict=True)],
                "object": _row_object(obj, request),
            }
            for obj in items
        ]
    return {
        "kind": "Table",
        "apiVersion": request.api_version,
        "metadata": meta,
        # Go's Table has no omitempty here: a Table without headers says null.
        "columnDefinitions": definitions if headers else None,
        "rows": rows,
    }


def _definition(
    name: str, type_: str, priority: int, format_: str = "", description: str = ""
) -> Obj:
    if name == "Name" and not format_ and not description:  # the built-in NAME column
        format_, description = "name", NAME_DESCRIPTION
    return {
        "name": name,
        "type": type_,
        "format": format_,
        "priority": priority,
        "description": description,
    }


def _described(column: PrinterColumn) -> str:
    return f"Custom resource definition column (in JSONPath format): {column.json_path}"


def _compile(path: str) -> tuple[jsonpath.Step, ...] | None:
    try:
        return jsonpath.parse(path)
    except jsonpath.JSONPathError:
        return None  # the column stays empty rather than failing the whole list


def _cell(type_: str, path: tuple[jsonpath.Step, ...] | None, obj: Obj) -> Any:
    """One CRD column's cell, as apiextensions' tableconvertor types it (None when absent)."""
    found = jsonpath.find(obj, path) if path is not None else []
    if not found or found[0] is None:
        return None
    value = found[0]
    if type_ == "string":
        return _as_text(value)
    if type_ == "integer" and isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if type_ == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if type_ == "boolean" and isinstance(value, bool):
        return value
    if type_ == "date" and isinstance(value, str):
        # The server turns dates into ages itself (ConvertToHumanReadableDateType).
        return printers.since(value) if printers.parse_time(value) else "<invalid>"
    return None


def _as_text(value: Any) -> str:
    """What Go's jsonpath prints for a value: JSON for objects and lists, plain text otherwise."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)
