"""Strategic merge patch, as the API server applies it to built-in kinds, guided by their schema.

A list whose schema says `x-kubernetes-patch-strategy: merge` is merged by its
`x-kubernetes-patch-merge-key` (containers by name, ports by containerPort) or, for scalars, as a
union; other lists and scalars are replaced; `null` removes a field. The directives kubectl
sends are honoured: `$patch` (replace, delete, merge), `$retainKeys`, `$setElementOrder/<list>`
and `$deleteFromPrimitiveList/<list>`. All are pure functions over plain values.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from snooze.sandbox import schemas

Obj = dict[str, Any]
ORDER = "$setElementOrder/"
DELETE_FROM = "$deleteFromPrimitiveList/"


class StrategicPatchError(ValueError):
    """A patch that breaks the rules of strategic merge; the API server answers 422."""


def _resolve(schema: Any, definitions: Mapping[str, Obj]) -> Obj:
    while isinstance(schema, dict):
        ref = schema.get("$ref") or (
            schema["allOf"][0].get("$ref") if len(schema.get("allOf") or ()) == 1 else None
        )
        if not ref:
            return schema
        schema = definitions.get(schemas.ref_name(ref), {})
    return {}


def _field_schema(schema: Obj, key: str, definitions: Mapping[str, Obj]) -> Obj:
    properties = schema.get("properties") or {}
    if key in properties:
        return _resolve(properties[key], definitions)
    extra = schema.get("additionalProperties")
    return _resolve(extra, definitions) if isinstance(extra, dict) else {}


def _clean(value: Any) -> Any:
    """A value from a patch without its directives: what is stored of it."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_clean(item) for item in value]
    return value


def apply(target: Any, patch: Any, schema: Obj, definitions: Mapping[str, Obj]) -> Any:
    """Apply a strategic merge patch to `target` (of type `schema`); returns a new value."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return _clean(patch)
    if directive == "delete":
        return None
    if directive not in (None, "merge"):
        raise StrategicPatchError(f"Unknown patch type: {directive}")
    result: Obj = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith(DELETE_FROM):
            name = key.removeprefix(DELETE_FROM)
            result[name] = [v for v in result.get(name) or [] if v not in value]
        elif key.startswith("$"):
            continue
        elif value is None:
            result.pop(key, None)
        else:
            sub = _field_schema(schema, key, definitions)
            if isinstance(value, list) and "merge" in str(sub.get("x-kubernetes-patch-strategy")):
                result[key] = _merge_list(result.get(key), value, sub, definitions)
            else:
                merged = apply(result.get(key), value, sub, definitions)
                if merged is None:
                    result.pop(key, None)
                else:
                    result[key] = merged
    for key, order in patch.items():
        if key.startswith(ORDER) and isinstance(result.get(key.removeprefix(ORDER)), list):
            name = key.removeprefix(ORDER)
            result[name] = _ordered(result[name], order, schema, name, definitions)
    if isinstance(patch.get("$retainKeys"), list):
        result = {k: v for k, v in result.items() if k in patch["$retainKeys"]}
    return result


def _merge_list(current: Any, patch: list[Any], schema: Obj, definitions: Mapping[str, Obj]) -> Any:
    key = schema.get("x-kubernetes-patch-merge-key")
    existing = list(current) if isinstance(current, list) else []
    if not key:
        # A list of scalars merged as a set: new values are appended, in the patch's order.
        return existing + [_clean(v) for v in patch if v not in existing]
    items = _resolve(schema.get("items"), definitions)
    for element in patch:
        if not isinstance(element, dict) or key not in element:
            raise StrategicPatchError(f"map: {element} does not contain declared merge key: {key}")
        at = next((i for i, e in enumerate(existing) if e.get(key) == element[key]), None)
        if element.get("$patch") == "delete":
            if at is not None:
                existing.pop(at)
        elif at is None:
            existing.append(_clean(element))
        else:
            existing[at] = apply(existing[at], element, items, definitions)
    return existing


def _ordered(
    values: list[Any], order: list[Any], schema: Obj, name: str, definitions: Mapping[str, Obj]
) -> list[Any]:
    """`values` in the order `$setElementOrder` gives; those it does not name keep their place."""
    key = _field_schema(schema, name, definitions).get("x-kubernetes-patch-merge-key")

    def identity(value: Any) -> Any:
        return value.get(key) if key and isinstance(value, dict) else value

    rank = {repr(identity(v)): i for i, v in enumerate(order)}
    named = sorted((v for v in values if repr(identity(v)) in rank),
                   key=lambda v: rank[repr(identity(v))])  # fmt: skip
    slots = iter(named)
    return [next(slots) if repr(identity(v)) in rank else v for v in values]
