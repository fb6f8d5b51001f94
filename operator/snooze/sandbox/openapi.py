"""The OpenAPI v3 documents kubectl reads for `explain`, validation and patches: /openapi/v3/...

Like the API server, /openapi/v3 lists one document per group-version, each at a URL with the
hash of its content (a client may cache it for good); a stale hash is redirected to the current
one. Each document has the paths of the group-version's resources (whose operations name the
group-version-kind and the query parameters the sandbox honours, such as `fieldValidation`) and
the schemas of its kinds. /openapi/v2 has them all in one document (swagger.py).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any

import aiohttp.web

from snooze.sandbox import schemas, swagger
from snooze.sandbox.api import ApiError
from snooze.sandbox.discovery import Registry, ResourceSpec

Obj = dict[str, Any]
PATCH = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch"
FIELD_VALIDATION = {
    "name": "fieldValidation",
    "in": "query",
    "description": (
        "fieldValidation instructs the server on how to handle objects in the request"
        " (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore:"
        " This will ignore any unknown fields that are silently dropped from the object, and will"
        " ignore all but the last duplicate field that the decoder encounters. - Warn: This will"
        " send a warning via the standard warning response header for each unknown field that"
        " is dropped from the object, and for each duplicate field that is encountered. The"
        " request will still succeed if there are no other errors, and will only persist the"
        " last of any duplicate fields. This is the default in v1.23+ - Strict: This will fail"
        " the request with a BadRequest error if any unknown fields would be dropped from the"
        " object, or if any duplicate fields are present. The error returned from the server"
        " will contain all unknown and duplicate fields encountered."
    ),
    "schema": {"type": "string", "uniqueItems": True},
}
LIST_PARAMETERS = [
    {"name": name, "in": "query", "schema": {"type": kind, "uniqueItems": True}}
    for name, kind in (
        ("allowWatchBookmarks", "boolean"),
        ("continue", "string"),
        ("fieldSelector", "string"),
        ("labelSelector", "string"),
        ("limit", "integer"),
        ("resourceVersion", "string"),
        ("sendInitialEvents", "boolean"),
        ("timeoutSeconds", "integer"),
        ("watch", "boolean"),
    )
]
# The patch types the sandbox applies; custom resources take no strategic merge patch.
PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
)


def _operation(spec: ResourceSpec, action: str, kind_ref: str, *, body: str = "") -> Obj:
    operation: Obj = {
        "description": f"{action} {spec.kind}",
        "operationId": f"{action}{spec.kind}",
        "responses": {
            "200": {
                "description": "OK",
                "content": {"application/json": {"schema": {"$ref": kind_ref}}},
            }
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {
            "group": spec.group,
            "version": spec.version,
            "kind": spec.kind,
        },
    }
    if action == "list":
        operation["parameters"] = LIST_PARAMETERS
    if body:
        operation["parameters"] = [FIELD_VALIDATION]
        types = PATCH_TYPES[:2] if spec.custom else PATCH_TYPES
        content = types if body == "patch" else ("application/json",)
        schema = {"$ref": schemas.REF_PREFIX + PATCH} if body == "patch" else {"$ref": kind_ref}
        operation["requestBody"] = {"content": {c: {"schema": schema} for c in content}}
    return operation


def resource_paths(spec: ResourceSpec, kind_ref: str) -> Obj:
    """The paths of one resource and its status, with an operation for each verb it has."""
    prefix = f"/apis/{spec.group}/{spec.version}" if spec.group else f"/api/{spec.version}"
    collection = (
        f"{prefix}/namespaces/{{namespace}}/{spec.plural}"
        if spec.namespaced
        else f"{prefix}/{spec.plural}"
    )
    verbs = set(spec.verbs)
    item: Obj = {}
    for verb, method, action, body in (
        ("get", "get", "get", ""),
        ("update", "put", "put", "object"),
        ("patch", "patch", "patch", "patch"),
        ("delete", "delete", "delete", ""),
    ):
        if verb in verbs:
            item[method] = _operation(spec, action, kind_ref, body=body)
    listing: Obj = {}
    for verb, method, action, body in (
        ("list", "get", "list", ""),
        ("create", "post", "post", "object"),
        ("deletecollection", "delete", "deletecollection", ""),
    ):
        if verb in verbs:
            listing[method] = _operation(spec, action, kind_ref, body=body)
    paths = {collection: listing, f"{collection}/{{name}}": item}
    if spec.namespaced and "list" in verbs:
        paths[f"{prefix}/{spec.plural}"] = {"get": _operation(spec, "list", kind_ref)}
    if spec.has_status:
        paths[f"{collection}/{{name}}/status"] = {
            method: _operation(spec, action, kind_ref, body=body)
            for method, action, body in (("get", "get", ""), ("put", "put", "object"),
                                         ("patch", "patch", "patch"))
        }  # fmt: skip
    return {path: operations for path, operations in paths.items() if operations}


def group_version_document(specs: list[ResourceSpec], title_version: str) -> Obj:
    """The OpenAPI v3 document of one group-version's resources; pure."""
    paths: Obj = {}
    names: list[str] = [PATCH]
    custom: dict[str, Obj] = {}
    for spec in specs:
        if spec.custom:
            name = schemas.crd_definition_name(spec.group, spec.version, spec.kind)
            custom[name] = dict(spec.schema or {})
            names.append(schemas.OBJECT_META)
        else:
            name = schemas.builtin_kinds()[spec.group, spec.version, spec.kind]
            names.append(name)
        paths.update(resource_paths(spec, schemas.REF_PREFIX + name))
    components = schemas.closure(names, schemas.builtin()) | custom
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": title_version},
        "paths": paths,
        "components": {"schemas": dict(sorted(components.items()))},
    }


class Documents:
    """The documents of a registry's group-versions, rebuilt when their resources change."""

    def __init__(self, registry: Registry, title_version: str) -> None:
        self.registry = registry
        self.title_version = title_version
        self._cache: dict[str, tuple[Any, Obj, bytes, str]] = {}
        self._v2: tuple[list[str], bytes, bytes] | None = None  # digests, JSON, protobuf

    def _by_key(self) -> dict[str, list[ResourceSpec]]:
        found: dict[str, list[ResourceSpec]] = {}
        for (group, version, _), spec in sorted(self.registry.specs.items()):
            key = f"apis/{group}/{version}" if group else f"api/{version}"
            found.setdefault(key, []).append(spec)
        return found

    def _document(self, key: str, specs: list[ResourceSpec]) -> tuple[Obj, bytes, str]:
        # A CRD's new schema is a new object: its identity tells that the document changed.
        fingerprint = [(spec, id(spec.schema)) for spec in specs]
        cached = self._cache.get(key)
        if cached is None or cached[0] != fingerprint:
            doc = group_version_document(specs, self.title_version)
            body = json.dumps(doc).encode()
            cached = (fingerprint, doc, body, hashlib.sha512(body).hexdigest().upper())
            self._cache[key] = cached
        return cached[1], cached[2], cached[3]

    def index(self) -> Obj:
        """/openapi/v3: where each group-version's document is, under the hash of its content."""
        paths = {}
        for key, specs in self._by_key().items():
            _, _, digest = self._document(key, specs)
            paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest}"}
        return {"paths": paths}

    def swagger(self) -> tuple[bytes, bytes]:
        """/openapi/v2 as JSON and as protobuf, rebuilt when a group-version's document changes."""
        documents = [self._document(key, specs) for key, specs in self._by_key().items()]
        digests = [digest for _, _, digest in documents]
        if self._v2 is None or self._v2[0] != digests:
            doc = swagger.document([d for d, _, _ in documents], self.title_version)
            self._v2 = (digests, json.dumps(doc).encode(), swagger.encode(doc))
        return self._v2[1], self._v2[2]

    def serve(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Answer a request under /openapi/ as the API server's OpenAPI handlers do."""
        accept = raw.headers.get("Accept", "")
        path = raw.path.rstrip("/")
        if path == "/openapi/v2":
            as_json, as_protobuf = self.swagger()
            if "protobuf" in accept and "spec.v2" in accept:
                return self._respond(raw, as_protobuf, swagger.PROTOBUF)
            if accept and not any(t in accept for t in ("application/json", "*/*")):
                raise ApiError(406, "/openapi/v2 is served as JSON or as protobuf")
            return self._respond(raw, as_json, "application/json")
        if accept and not any(t in accept for t in ("application/json", "*/*")):
            raise ApiError(406, "only application/json is served by the sandbox's OpenAPI v3")
        if path == "/openapi/v3":
            return aiohttp.web.json_response(self.index())
        key = path.removeprefix("/openapi/v3/")
        specs = self._by_key().get(key) if path.startswith("/openapi/v3/") else None
        if specs is None:
            raise ApiError(404, "the server could not find the requested resource")
        _, body, digest = self._document(key, specs)
        wanted = raw.query.get("hash")
        if wanted and wanted != digest:
            location = f"/openapi/v3/{key}?hash={digest}"
            return aiohttp.web.Response(status=301, headers={"Location": location})
        return self._respond(raw, body, "application/json", immutable=bool(wanted))

    @staticmethod
    def _respond(
        raw: aiohttp.web.BaseRequest, body: bytes, content_type: str, *, immutable: bool = False
    ) -> aiohttp.web.Response:
        digest = hashlib.sha512(body).hexdigest().upper()
        headers = {"ETag": f'"{digest}"', "Vary": "Accept"}
        if immutable:
            # The URL names the content's hash: a client may keep it for good.
            expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=365)
            headers["Cache-Control"] = "public, immutable"
            headers["Expires"] = expires.strftime("%a, %d %b %Y %H:%M:%S GMT")
        if raw.headers.get("If-None-Match") == headers["ETag"]:
            return aiohttp.web.Response(status=304, headers=headers)
        return aiohttp.web.Response(body=body, content_type=content_type, headers=headers)
