"""What the sandbox serves: built-in resources, those that CRDs add, and the discovery documents."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from snooze.sandbox import schemas
from snooze.sandbox.api import ApiError

SERVER_VERSION = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0-snooze-sandbox",
    "platform": "linux/amd64",
    "compiler": "gc",
}
DEFAULT_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True, kw_only=True)
class ScalePaths:
    """Where a resource keeps what its `scale` subresource shows (JSON paths without the `$`)."""

    spec_replicas: str = ".spec.replicas"
    status_replicas: str = ".status.replicas"
    label_selector: str | None = None  # None: render .spec.selector (a LabelSelector object)


@dataclass(frozen=True, kw_only=True)
class PrinterColumn:
    """One of a CRD version's additionalPrinterColumns, as the Table of its objects shows it."""

    name: str
    type: str
    json_path: str
    format: str = ""
    priority: int = 0
    description: str = ""

    @classmethod
    def from_crd(cls, column: Mapping[str, Any]) -> PrinterColumn:
        return cls(
            name=column["name"],
            type=column.get("type", "string"),
            json_path=column["jsonPath"],
            format=column.get("format", ""),
            priority=int(column.get("priority", 0)),
            description=column.get("description", ""),
        )


@dataclass(frozen=True, kw_only=True)
class ResourceSpec:
    """One served resource at one group/version, with what discovery says about it."""

    group: str
    version: str
    plural: str
    kind: str
    singular: str
    namespaced: bool
    verbs: tuple[str, ...] = DEFAULT_VERBS
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    scale: ScalePaths | None = None
    custom: bool = (
        False  # defined by a CRD: its strategy differs from the built-ins' (see emulator)
    )
    # A CRD's additionalPrinterColumns at this version; empty: NAME and AGE.
    printer_columns: tuple[PrinterColumn, ...] = ()
    # A CRD's schema at this version, as OpenAPI documents show it (schemas.crd_kinds).
    schema: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int]:
    """Sort key of Kubernetes versions: GA before beta before alpha, higher numbers first; pure."""
    match = _VERSION.match(version)
    if match is None:
        return (0, 0, 0)
    stability = {"alpha": 1, "beta": 2, None: 3}[match[2]]
    return (stability, int(match[1]), int(match[3] or 0))


@dataclass(kw_only=True)
class Registry:
    """The resources the sandbox serves, keyed by (group, version, plural)."""

    specs: dict[tuple[str, str, str], ResourceSpec] = field(default_factory=dict)
    # A CRD's storage version is its group's preferred one, as the API server reports it.
    preferred: dict[str, str] = field(default_factory=dict)

    def add(self, spec: ResourceSpec) -> None:
        self.specs[spec.group, spec.version, spec.plural] = spec

    def get(self, group: str, version: str, plural: str) -> ResourceSpec | None:
        return self.specs.get((group, version, plural))

    def groups(self) -> dict[str, list[str]]:
        """Group -> served versions, preferred first."""
        result: dict[str, set[str]] = {}
        for group, version, _ in self.specs:
            result.setdefault(group, set()).add(version)
        ordered: dict[str, list[str]] = {}
        for group, versions in sorted(result.items()):
            ranked = sorted(versions, key=version_priority, reverse=True)
            if group in self.preferred and self.preferred[group] in versions:
                ranked.remove(self.preferred[group])
                ranked.insert(0, self.preferred[group])
            ordered[group] = ranked
        return ordered

    # -- CRDs ------------------------------------------------------------------------------------

    def register_crd(self, crd: Mapping[str, Any]) -> None:
        """Serve the resource that a CustomResourceDefinition declares, at each served version."""
        spec = crd.get("spec", {})
        names = spec.get("names", {})
        group = spec["group"]
        built = {gvk[1]: schema for gvk, schema in schemas.crd_kinds(crd).values()}
        for version in spec.get("versions", []):
            if not version.get("served", True):
                continue
            declared = version.get("subresources") or {}
            scale_decl = declared.get("scale")
            scale = None
            if scale_decl is not None:
                scale = ScalePaths(
                    spec_replicas=scale_decl.get("specReplicasPath", ".spec.replicas"),
                    status_replicas=scale_decl.get("statusReplicasPath", ".status.replicas"),
                    label_selector=scale_decl.get("labelSelectorPath") or "",
                )
            self.add(
                ResourceSpec(
                    group=group,
                    version=version["name"],
                    plural=names["plural"],
                    kind=names["kind"],
                    singular=names.get("singular") or names["kind"].lower(),
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    short_names=tuple(names.get("shortNames") or ()),
                    categories=tuple(names.get("categories") or ()),
                    subresources=frozenset(key for key in ("status", "scale") if key in declared),
                    scale=scale,
                    custom=True,
                    printer_columns=tuple(
                        PrinterColumn.from_crd(column)
                        for column in version.get("additionalPrinterColumns") or ()
                    ),
                    schema=built.get(version["name"]),
                )
            )
            if version.get("storage"):
                self.preferred[group] = version["name"]

    def unregister_crd(self, crd: Mapping[str, Any]) -> None:
        spec = crd.get("spec", {})
        group, plural = spec.get("group"), spec.get("names", {}).get("plural")
        for key in [key for key in self.specs if key[0] == group and key[2] == plural]:
            del self.specs[key]
        if not any(key[0] == group for key in self.specs):
            self.preferred.pop(group, None)

    # -- Discovery documents ---------------------------------------------------------------------

    def api_group(self, group: str) -> dict[str, Any] | None:
        versions = self.groups().get(group)
        if not versions:
            return None
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def api_group_list(self) -> dict[str, Any]:
        groups = [self.api_group(group) for group in self.groups() if group]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [g for g in groups if g]}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        specs = [s for (g, v, _), s in sorted(self.specs.items()) if g == group and v == version]
        if not specs:
            return None
        resources: list[dict[str, Any]] = []
        for spec in specs:
            resources.append(
                {
                    "name": spec.plural,
                    "singularName": spec.singular,
                    "namespaced": spec.namespaced,
                    "kind": spec.kind,
                    "verbs": sorted(spec.verbs),
                    **({"shortNames": list(spec.short_names)} if spec.short_names else {}),
                    **({"categories": list(spec.categories)} if spec.categories else {}),
                }
            )
            if spec.has_status:
                resources.append(
                    {
                        "name": f"{spec.plural}/status",
                        "singularName": "",
                        "kind": spec.kind,
                        "namespaced": spec.namespaced,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if spec.scale is not None:
                resources.append(
                    {
                        "name": f"{spec.plural}/scale",
                        "singularName": "",
                        "kind": "Scale",
                        "group": "autoscaling",
                        "version": "v1",
                        "namespaced": spec.namespaced,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }


def root_document(path: str, host: str, registry: Registry) -> Any:
    """What the API server answers at /api, /apis, /version and its health checks, or None."""
    path = path.rstrip("/") or path
    if path == "/api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
        }
    if path == "/apis":
        return registry.api_group_list()
    if path == "/version":
        return SERVER_VERSION
    return "ok" if path in ("/healthz", "/livez", "/readyz") else None


# Built-ins whose `scale` subresource the sandbox serves (needed for scale-to-zero).
_SCALABLE = {("apps", "deployments"), ("apps", "statefulsets"), ("apps", "replicasets")}
# Built-in subresources that the sandbox really serves; the rest (exec, log, ...) are not listed.
_SERVED_SUBRESOURCES = frozenset({"status"})


def bundled_specs() -> list[ResourceSpec]:
    """The built-in resources of a recent cluster, from the list that kmock bundles."""
    import kmock

    bundled = kmock.ResourcesArray()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kmock 0.8 uses read_binary()
        bundled.load_bundled()
    specs = []
    for res in bundled:
        info = bundled[res]
        if res.group is None or res.version is None or res.plural is None:
            continue
        scalable = (res.group, res.plural) in _SCALABLE
        specs.append(
            ResourceSpec(
                group=res.group,
                version=res.version,
                plural=res.plural,
                kind=info.kind or res.plural.capitalize(),
                singular=info.singular or res.plural,
                namespaced=bool(info.namespaced),
                verbs=tuple(sorted(info.verbs)) or DEFAULT_VERBS,
                short_names=tuple(sorted(info.shortnames)),
                categories=tuple(sorted(info.categories)),
                subresources=frozenset(set(info.subresources) & _SERVED_SUBRESOURCES),
                scale=ScalePaths() if scalable else None,
            )
        )
    return specs


def builtin_registry() -> Registry:
    """The resources that Kubernetes itself serves, each with its schema.

    kmock's list also has Gateway API and metrics.k8s.io resources, which a cluster serves only
    once their CRDs or metrics-server are installed: the sandbox leaves them out.
    """
    registry = Registry()
    known = schemas.builtin_kinds()
    for spec in bundled_specs():
        if (spec.group, spec.version, spec.kind) in known:
            registry.add(spec)
    return registry


def check_crd(crd: dict[str, Any], name: str) -> None:
    """Refuse a CustomResourceDefinition whose names the API server would refuse."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    if not spec.get("group") or not names.get("plural") or not names.get("kind"):
        raise ApiError(
            422,
            f'CustomResourceDefinition "{name}" is invalid:'
            " spec.group, spec.names.plural and spec.names.kind are required",
        )
    if name != f"{names['plural']}.{spec['group']}":
        raise ApiError(
            422,
            f'CustomResourceDefinition "{name}" is invalid: metadata.name:'
            f' Invalid value: "{name}": must be spec.names.plural+"."+spec.group',
        )
