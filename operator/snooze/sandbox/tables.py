"""The Tables that kubectl asks for: CRD printer columns, built-in printers, or NAME and AGE."""

from __future__ import annotations

import json
from typing import Any

from snooze.sandbox import jsonpath, printers
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


def table(spec: ResourceSpec, items: list[Obj], meta: Obj) -> Obj:
    """The Table of `items`, with the objects included, as the API server renders it."""
    builtin = None if spec.custom else printers.BUILTIN.get((spec.group, spec.plural))
    if builtin is not None:
        columns, cells_of = builtin
        definitions = [_definition(name, type_, priority) for name, type_, priority in columns]
        rows = [{"cells": cells_of(obj), "object": obj} for obj in items]
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
                "cells": [obj["metadata"]["name"]]
                + [_cell(c.type, path, obj) for c, path in zip(custom, paths, strict=True)],
                "object": obj,
            }
            for obj in items
        ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": definitions,
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
