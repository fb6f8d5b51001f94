"""What the sandbox answers besides stored objects: watch events, patches, JSON bodies."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web

from snooze.sandbox import api, patches, schemas, selectors, strategic
from snooze.sandbox.api import ApiError
from snooze.sandbox.discovery import ResourceSpec

Obj = dict[str, Any]
ResourceKey = tuple[str, str, str]  # group, version, plural


@dataclass(frozen=True, kw_only=True)
class Change:
    """One write, as watchers see it: `old` lets selectors turn MODIFIED into ADDED/DELETED."""

    rv: int
    resource: ResourceKey
    type: str
    obj: Obj
    old: Obj | None


def crd_status(crd: Obj) -> Obj:
    names = crd["spec"]["names"]
    now = api.now_rfc3339()
    return {
        "acceptedNames": names,
        "storedVersions": [v["name"] for v in crd["spec"].get("versions", []) if v.get("storage")],
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
                "lastTransitionTime": now,
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
                "lastTransitionTime": now,
            },
        ],
    }


def as_event(
    change: Change, key: ResourceKey, namespace: str | None, predicate: Callable[[Obj], bool]
) -> Obj | None:
    """How one change looks to one watcher, or None if it does not see it; pure."""
    if change.resource != key:
        return None
    if namespace is not None and change.obj["metadata"].get("namespace") != namespace:
        return None
    now = predicate(change.obj)
    before = change.old is not None and predicate(change.old)
    if change.type == "MODIFIED" and now != before:
        # An object that starts or stops matching the selectors appears or disappears.
        return {"type": "ADDED" if now else "DELETED", "object": change.obj}
    return {"type": change.type, "object": change.obj} if now else None


def bookmark(spec: ResourceSpec, rv: str, *, initial_end: bool) -> Obj:
    meta: Obj = {"resourceVersion": rv}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return {
        "type": "BOOKMARK",
        "object": {"kind": spec.kind, "apiVersion": spec.api_version, "metadata": meta},
    }


def predicate(spec: ResourceSpec, query: Mapping[str, str]) -> Callable[[Obj], bool]:
    try:
        return selectors.compile_selectors(
            label_selector=query.get("labelSelector", ""),
            field_selector=query.get("fieldSelector", ""),
            kind=spec.kind,
        )
    except selectors.SelectorError as exc:
        raise ApiError(400, str(exc)) from exc


def apply_patch(
    old: Obj, data: Any, content_type: str, schema: Obj | None = None, *, custom: bool = False
) -> Obj:
    """Apply a JSON, merge or strategic merge patch (the latter by the kind's `schema`)."""
    if content_type == "application/json-patch+json":
        try:
            result = patches.json_patch(old, data)
        except patches.PatchError as exc:
            raise ApiError(422, str(exc)) from exc
    elif content_type == "application/strategic-merge-patch+json" and custom:
        raise ApiError(
            415,
            "the body of the request was in an unknown format - accepted media types include:"
            " application/json-patch+json, application/merge-patch+json",
        )
    elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        if not isinstance(data, dict):
            raise ApiError(400, "a merge patch must be a JSON object")
        if content_type == "application/merge-patch+json" or schema is None:
            result = patches.merge_patch(old, data)  # a Scale has no lists to merge by key
        else:
            try:
                result = strategic.apply(old, data, schema, schemas.builtin())
            except strategic.StrategicPatchError as exc:
                raise ApiError(422, str(exc)) from exc
    else:
        raise ApiError(415, f"the patch type {content_type!r} is not supported by the sandbox")
    if not isinstance(result, dict):
        raise ApiError(422, "the patched object is not a JSON object")
    # A merge patch shares the untouched parts of `old`; committing edits metadata in place.
    return copy.deepcopy(result)


def sort_key(obj: Obj) -> str:
    return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


def encode_continue(start: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"start": start}).encode()).decode()


def decode_continue(token: str) -> str | None:
    if not token:
        return None
    try:
        start: str = json.loads(base64.urlsafe_b64decode(token.encode()))["start"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(400, "continue key is not valid") from exc
    return start


def decode(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from exc


def respond(
    payload: Any, status: int = 200, *, warnings: Iterable[str] = ()
) -> aiohttp.web.Response:
    response = aiohttp.web.json_response(payload, status=status)
    for warning in warnings:
        # RFC 7234 warn-code 299 ("miscellaneous persistent warning"), as the API server sends.
        response.headers.add("Warning", f"299 - {json.dumps(warning)}")
    return response
