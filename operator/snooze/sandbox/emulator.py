"""kmock's KubernetesEmulator with the API server behaviours that kopf and kubectl rely on."""

from __future__ import annotations

import collections
import copy
import re
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock

from snooze.sandbox import api, auth, discovery, openapi, scale, tables, validation, views
from snooze.sandbox.api import ApiError, ApiPath
from snooze.sandbox.auth import Tokens
from snooze.sandbox.discovery import ResourceSpec
from snooze.sandbox.validation import NO_CHECK, Check
from snooze.sandbox.views import Change, Obj
from snooze.sandbox.watches import Watches

WRITES = ("POST", "PUT", "PATCH", "DELETE")
_IN_NAMESPACE = re.compile(r"/namespaces/([^/]+)/")
# Namespaces that every cluster has from the start.
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


@dataclass(kw_only=True)
class Fault:
    """A failure to answer instead of serving the next `remaining` matching requests."""

    method: str | None
    path_contains: str
    status: int
    remaining: int
    message: str


def _without(obj: Mapping[str, Any], keys: set[str]) -> Obj:
    return {k: v for k, v in obj.items() if k not in keys}


@attrs.define(kw_only=True)
class SandboxEmulator(kmock.KubernetesEmulator):
    """Serves resource URLs like the API server; anything else goes to kmock's own reactions."""

    registry: discovery.Registry = attrs.field(factory=discovery.builtin_registry)
    _rv: int = attrs.field(default=0, init=False)
    watches: Watches = attrs.field(factory=Watches, init=False)
    _faults: list[Fault] = attrs.field(factory=list, init=False)
    _counts: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)
    _paths: collections.Counter[tuple[str, str]] = attrs.field(
        factory=collections.Counter, init=False
    )
    _writes: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)
    # Tests inject faults and read counters from their own thread while the loop serves.
    _guard: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    openapi: openapi.Documents = attrs.field(init=False)
    tokens: Tokens = attrs.field(factory=Tokens, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.openapi = openapi.Documents(self.registry, discovery.SERVER_VERSION["gitVersion"])
        for name in INITIAL_NAMESPACES:
            spec = self._spec("", "v1", "namespaces")
            self._create(spec, None, {"metadata": {"name": name}})

    # -- Test seams ------------------------------------------------------------------------------

    def inject_fault(
        self, *, method: str | None, path_contains: str, status: int, times: int, message: str
    ) -> None:
        with self._guard:
            self._faults.append(
                Fault(
                    method=method.upper() if method else None,
                    path_contains=path_contains,
                    status=status,
                    remaining=times,
                    message=message,
                )
            )

    def requests_count(self, method: str | None = None, path_contains: str = "") -> int:
        with self._guard:
            if path_contains:
                return sum(
                    n
                    for (verb, path), n in self._paths.items()
                    if path_contains in path and (method is None or method.upper() == verb)
                )
            return self._counts[method.upper()] if method else sum(self._counts.values())

    def writes_count(self, namespace: str) -> int:
        with self._guard:
            return self._writes[namespace]

    def _take_fault(self, method: str, path_qs: str) -> Fault | None:
        with self._guard:
            self._counts[method] += 1
            self._paths[(method, path_qs)] += 1
            if method in WRITES:
                found = _IN_NAMESPACE.search(path_qs.partition("?")[0])
                self._writes[found.group(1) if found else ""] += 1
            for fault in self._faults:
                if fault.method in (None, method) and fault.path_contains in path_qs:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def close_watches(self) -> None:
        """End every watch stream now, so that the server can stop without waiting for them."""
        self.watches.close()

    # -- HTTP entry point ------------------------------------------------------------------------

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        body = await raw.read()
        if not self.tokens.admit(raw.headers.get("Authorization")):
            return views.respond(api.status_body(401, "Unauthorized"), 401)
        fault = self._take_fault(raw.method, raw.path_qs)
        if fault is not None:
            return views.respond(api.status_body(fault.status, fault.message), fault.status)
        try:
            root = discovery.root_document(raw.path, raw.host or "127.0.0.1", self.registry)
            if root is not None:
                return views.respond(root)
            if raw.path.startswith("/openapi/"):
                return self.openapi.serve(raw)
            path = api.parse_api_path(raw.path)
            if path is None:
                response: aiohttp.web.StreamResponse = await super().__call__(raw)
                return response
            return await self._serve_resource_url(raw, path, body)
        except ApiError as exc:
            return views.respond(exc.status(), exc.code)

    async def _serve_resource_url(
        self, raw: aiohttp.web.BaseRequest, path: ApiPath, body: bytes
    ) -> aiohttp.web.StreamResponse:
        if path.version is None:
            doc = self.registry.api_group(path.group)
            if doc is None:
                raise ApiError(404, "the server could not find the requested resource")
            return views.respond(doc)
        if path.plural is None:
            rl = self.registry.resource_list(path.group, path.version)
            if rl is None:
                raise ApiError(404, "the server could not find the requested resource")
            return views.respond(rl)
        spec = self._spec(path.group, path.version, path.plural)
        if body and "protobuf" in raw.content_type:
            # Clients retry with JSON on 415; the sandbox stores JSON only.
            raise ApiError(415, f"the body of type {raw.content_type} is not supported")
        data = views.decode(body)
        query, method = raw.query, raw.method
        as_table = tables.requested(raw.headers.get("Accept", ""), query)
        if method == "GET" and (path.legacy_watch or query.get("watch") in ("true", "1")):
            current = lambda: self._iter(spec, path.namespace)  # noqa: E731
            render = tables.watch_renderer(spec, as_table)
            return await self.watches.serve(
                raw, spec, path, current=current, rv=self._rv, render=render
            )
        if query.get("dryRun") and method != "GET":  # refused rather than carried out for real
            raise ApiError(400, "the snooze sandbox does not do dry runs: nothing was changed")
        if spec.group == "authorization.k8s.io" and spec.plural in auth.ACCESS_REVIEWS:
            if method != "POST" or path.name is not None:
                raise ApiError(405, f"{spec.plural} are created, never read")
            return views.respond(auth.access_review(data), 201)
        check = validation.check_for(spec, query, method=method)
        if path.name is None:
            if method == "GET":
                return views.respond(self._list(spec, path, query, as_table))
            if method == "POST":
                created = self._create(spec, path.namespace, data, check)
                return views.respond(created, 201, warnings=check.warnings)
            if method == "DELETE":
                return views.respond(self._delete_collection(spec, path, query))
        elif path.subresource in (None, "status"):
            if method == "GET":
                obj = self._get(spec, path)
                if path.subresource is None and as_table is not None:
                    meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
                    return views.respond(tables.table(spec, [obj], meta, as_table))
                return views.respond(obj)
            if method == "PUT":
                return views.respond(
                    self._replace(spec, path, data, check), warnings=check.warnings
                )
            if method == "PATCH":
                patched = self._patch(spec, path, data, raw.content_type, check)
                return views.respond(patched, warnings=check.warnings)
            if method == "DELETE" and path.subresource is None:
                return views.respond(self._delete(spec, path, data))
        elif path.subresource == "scale" and spec.scale is not None:
            if method == "GET":
                return views.respond(scale.scale_of(spec, self._get(spec, path)))
            if method in ("PUT", "PATCH"):
                return views.respond(self._write_scale(spec, path, data, raw.content_type, method))
        else:
            raise ApiError(404, "the server could not find the requested resource")
        raise ApiError(405, "the server does not allow this method on the requested resource")

    # -- Storage helpers -------------------------------------------------------------------------

    def _spec(self, group: str, version: str, plural: str) -> ResourceSpec:
        spec = self.registry.get(group, version, plural)
        if spec is None:
            raise ApiError(404, "the server could not find the requested resource")
        return spec

    @staticmethod
    def _ref(spec: ResourceSpec) -> kmock.resource:
        return kmock.resource(group=spec.group, version=spec.version, plural=spec.plural)

    def _load(self, spec: ResourceSpec, namespace: str | None, name: str) -> Obj:
        key = (self._ref(spec), namespace if spec.namespaced else None, name)
        if key not in self.objects or self.objects[key].deleted:
            what = f"{spec.plural}.{spec.group}" if spec.group else spec.plural
            raise ApiError(
                404,
                f'{what} "{name}" not found',
                details={
                    "name": name,
                    "group": spec.group,
                    "kind": spec.plural,
                },
            )
        return copy.deepcopy(self.objects[key].raw)

    def _iter(self, spec: ResourceSpec, namespace: str | None) -> list[Obj]:
        ref = self._ref(spec)
        found = [
            obj.raw
            for (res, ns, _), obj in self.objects.items()
            if res == ref and not obj.deleted and (namespace is None or ns == namespace)
        ]
        return sorted(
            found, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])
        )

    def _emit(self, spec: ResourceSpec, type_: str, obj: Obj, old: Obj | None) -> None:
        change = Change(
            rv=self._rv,
            resource=(spec.group, spec.version, spec.plural),
            type=type_,
            obj=copy.deepcopy(obj),
            old=old,
        )
        self.watches.publish(change)

    def _next_rv(self) -> str:
        # One counter for all objects, as etcd's revision: clients may compare but not parse it.
        self._rv += 1
        return str(self._rv)

    @staticmethod
    def _conflict(spec: ResourceSpec, name: str) -> ApiError:
        what = f"{spec.plural}.{spec.group}" if spec.group else spec.plural
        return ApiError(
            409,
            (
                f'Operation cannot be fulfilled on {what} "{name}": the object has been modified;'
                " please apply your changes to the latest version and try again"
            ),
            details={"name": name, "group": spec.group, "kind": spec.plural},
        )

    # -- Verbs -----------------------------------------------------------------------------------

    def _get(self, spec: ResourceSpec, path: ApiPath) -> Obj:
        assert path.name is not None
        return self._load(spec, path.namespace, path.name)

    def _list(
        self,
        spec: ResourceSpec,
        path: ApiPath,
        query: Mapping[str, str],
        as_table: tables.TableRequest | None,
    ) -> Obj:
        predicate = views.predicate(spec, query)
        items = [obj for obj in self._iter(spec, path.namespace) if predicate(obj)]
        start = views.decode_continue(query.get("continue", ""))
        if start is not None:
            items = [o for o in items if views.sort_key(o) > start]
        meta: Obj = {"resourceVersion": str(self._rv)}
        limit = int(query.get("limit") or 0)
        if 0 < limit < len(items):
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
            meta["continue"] = views.encode_continue(views.sort_key(items[-1]))
        if as_table is not None:
            return tables.table(spec, items, meta, as_table)
        return {
            "kind": f"{spec.kind}List",
            "apiVersion": spec.api_version,
            "metadata": meta,
            "items": items,
        }

    def _create(
        self, spec: ResourceSpec, url_namespace: str | None, data: Any, check: Check = NO_CHECK
    ) -> Obj:
        if not isinstance(data, dict):
            raise ApiError(400, "the body of the request must be a JSON object")
        obj: Obj = copy.deepcopy(data)
        meta: Obj = obj.setdefault("metadata", {})
        if spec.namespaced:
            body_ns = meta.get("namespace")
            if url_namespace and body_ns and body_ns != url_namespace:
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match"
                    " the namespace sent on the request",
                )
            meta["namespace"] = url_namespace or body_ns or "default"
        else:
            meta.pop("namespace", None)
        namespace = meta.get("namespace")
        name = meta.get("name")
        ref = self._ref(spec)
        if not name and meta.get("generateName"):
            name = api.generate_name(meta["generateName"])
            while (ref, namespace, name) in self.objects and not self.objects[
                ref, namespace, name
            ].deleted:
                name = api.generate_name(meta["generateName"])
        if not name:
            raise ApiError(
                422,
                f"{spec.kind} is invalid: metadata.name: Required value:"
                " name or generateName is required",
            )
        if (problem := api.name_problem(name)) is not None:
            raise ApiError(
                422,
                f'{spec.kind} "{name}" is invalid: metadata.name:'
                f' Invalid value: "{name}": {problem}',
            )
        if (ref, namespace, name) in self.objects and not self.objects[
            ref, namespace, name
        ].deleted:
            what = f"{spec.plural}.{spec.group}" if spec.group else spec.plural
            raise ApiError(
                409,
                f'{what} "{name}" already exists',
                reason="AlreadyExists",
                details={"name": name, "group": spec.group, "kind": spec.plural},
            )
        if spec.custom and spec.has_status:
            obj.pop("status", None)  # the CRD strategy ignores status on create
        check(obj)
        if spec.kind == "CustomResourceDefinition":
            discovery.check_crd(obj, name)
            validation.check_crd_defaults(obj, name)
        obj["apiVersion"], obj["kind"] = spec.api_version, spec.kind
        for system_field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(system_field, None)
        meta.update(
            {
                "name": name,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": api.now_rfc3339(),
                "generation": 1,
                "resourceVersion": self._next_rv(),
            }
        )
        if spec.kind == "Namespace":
            obj["status"] = {"phase": "Active"}
        if spec.kind == "CustomResourceDefinition":
            self.registry.register_crd(obj)
            obj["status"] = views.crd_status(obj)
        self.objects[ref, namespace, name] = obj
        self._emit(spec, "ADDED", obj, None)
        return copy.deepcopy(obj)

    def _replace(self, spec: ResourceSpec, path: ApiPath, data: Any, check: Check) -> Obj:
        assert path.name is not None
        old = self._load(spec, path.namespace, path.name)
        if not isinstance(data, dict):
            raise ApiError(400, "the body of the request must be a JSON object")
        meta = data.get("metadata") or {}
        if meta.get("name", path.name) != path.name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        if not meta.get("resourceVersion") and spec.custom:
            # Custom resources refuse unconditional updates; built-ins allow them.
            raise ApiError(
                422,
                f'{spec.kind} "{path.name}" is invalid: metadata.resourceVersion:'
                " Invalid value: 0x0: must be specified for an update",
            )
        return self._commit(spec, path, old, copy.deepcopy(data), check)

    def _patch(
        self, spec: ResourceSpec, path: ApiPath, data: Any, content_type: str, check: Check
    ) -> Obj:
        assert path.name is not None
        old = self._load(spec, path.namespace, path.name)
        patched = views.apply_patch(old, data, content_type, check.schema, custom=spec.custom)
        return self._commit(spec, path, old, patched, check)

    def _commit(
        self, spec: ResourceSpec, path: ApiPath, old: Obj, new: Obj, check: Check = NO_CHECK
    ) -> Obj:
        """Store an update as the API server does: preconditions, system fields, no-op skipping."""
        assert path.name is not None
        new_meta: Obj = new.setdefault("metadata", {})
        old_meta: Obj = old["metadata"]
        rv = new_meta.get("resourceVersion")
        if rv and rv != old_meta["resourceVersion"]:
            raise self._conflict(spec, path.name)
        if new_meta.get("uid") and new_meta["uid"] != old_meta["uid"]:
            raise ApiError(
                409,
                f"Precondition failed: UID in precondition: {old_meta['uid']},"
                f" UID in object meta: {new_meta['uid']}",
            )
        if path.subresource == "status":
            # Writes to /status change only .status; everything else stays as stored.
            result = copy.deepcopy(old)
            result.pop("status", None)
            if new.get("status") is not None:
                result["status"] = new["status"]
        else:
            result = new
            if spec.has_status:
                result.pop("status", None)  # the main resource ignores .status
                if "status" in old:
                    result["status"] = old["status"]
            for system in (
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "resourceVersion",
            ):
                result["metadata"].pop(system, None)
                if system in old_meta:
                    result["metadata"][system] = old_meta[system]
            result["apiVersion"], result["kind"] = old["apiVersion"], old["kind"]
        check(result)
        if spec.kind == "CustomResourceDefinition" and path.subresource is None:
            validation.check_crd_defaults(result, path.name)
        if result == old:
            return result  # a no-op write changes nothing, not even the resourceVersion
        # Generation counts changes of the desired state: not metadata, not status (if separate).
        ignored = {"metadata", "apiVersion", "kind"} | (
            {"status"} if spec.has_status or not spec.custom else set()
        )
        if _without(result, ignored) != _without(old, ignored):
            result["metadata"]["generation"] = old_meta.get("generation", 0) + 1
        result["metadata"]["resourceVersion"] = self._next_rv()
        ref = self._ref(spec)
        key = (ref, path.namespace if spec.namespaced else None, path.name)
        self.objects[key].create(result)
        if spec.kind == "CustomResourceDefinition" and path.subresource is None:
            self.registry.register_crd(result)
        self._emit(spec, "MODIFIED", result, old)
        if result["metadata"].get("deletionTimestamp") and not result["metadata"].get("finalizers"):
            self._remove(spec, key, result)
        return copy.deepcopy(result)

    def _delete(self, spec: ResourceSpec, path: ApiPath, options: Any) -> Obj:
        assert path.name is not None
        obj = self._load(spec, path.namespace, path.name)
        preconditions = (options or {}).get("preconditions") or {}
        if preconditions.get("resourceVersion") not in (None, obj["metadata"]["resourceVersion"]):
            raise self._conflict(spec, path.name)
        key = (self._ref(spec), path.namespace if spec.namespaced else None, path.name)
        meta = obj["metadata"]
        if not meta.get("finalizers"):
            return self._remove(spec, key, obj)
        if not meta.get("deletionTimestamp"):
            # Finalizers hold the object: it is only marked, and goes when they are all removed.
            old = copy.deepcopy(obj)
            meta["deletionTimestamp"] = api.now_rfc3339()
            meta["deletionGracePeriodSeconds"] = 0
            meta["resourceVersion"] = self._next_rv()
            self.objects[key].create(obj)
            self._emit(spec, "MODIFIED", obj, old)
        return obj

    def _remove(
        self, spec: ResourceSpec, key: tuple[kmock.resource, str | None, str], obj: Obj
    ) -> Obj:
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[key].delete()
        self._emit(spec, "DELETED", obj, None)
        if spec.kind == "CustomResourceDefinition":
            # The API server removes the custom objects along with their definition.
            for served in [
                s
                for s in self.registry.specs.values()
                if s.group == obj["spec"]["group"] and s.plural == obj["spec"]["names"]["plural"]
            ]:
                for item in self._iter(served, None):
                    m = item["metadata"]
                    self._remove(served, (self._ref(served), m.get("namespace"), m["name"]), item)
            self.registry.unregister_crd(obj)
        return obj

    def _delete_collection(
        self, spec: ResourceSpec, path: ApiPath, query: Mapping[str, str]
    ) -> Obj:
        predicate = views.predicate(spec, query)
        deleted = []
        for obj in self._iter(spec, path.namespace):
            if predicate(obj):
                meta = obj["metadata"]
                one = ApiPath(
                    group=spec.group,
                    version=spec.version,
                    plural=spec.plural,
                    namespace=meta.get("namespace"),
                    name=meta["name"],
                )
                deleted.append(self._delete(spec, one, None))
        return {
            "kind": f"{spec.kind}List",
            "apiVersion": spec.api_version,
            "metadata": {"resourceVersion": str(self._rv)},
            "items": deleted,
        }

    # -- Scale -----------------------------------------------------------------------------------

    def _write_scale(
        self, spec: ResourceSpec, path: ApiPath, data: Any, content_type: str, method: str
    ) -> Obj:
        assert spec.scale is not None
        obj = self._get(spec, path)
        current = scale.scale_of(spec, obj)
        new_scale = data if method == "PUT" else views.apply_patch(current, data, content_type)
        if not isinstance(new_scale, dict):
            raise ApiError(400, "the body of the request must be a Scale object")
        rv = (new_scale.get("metadata") or {}).get("resourceVersion")
        replicas = (new_scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise ApiError(
                422,
                f'Scale.autoscaling "{path.name}" is invalid: spec.replicas:'
                " Invalid value: must be greater than or equal to 0",
            )
        scale.assign(obj, spec.scale.spec_replicas, replicas)
        obj["metadata"]["resourceVersion"] = rv or obj["metadata"]["resourceVersion"]
        main = ApiPath(
            group=spec.group,
            version=spec.version,
            plural=spec.plural,
            namespace=path.namespace,
            name=path.name,
        )
        return scale.scale_of(spec, self._commit(spec, main, self._get(spec, path), obj))
