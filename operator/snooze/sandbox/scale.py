"""The scale subresource of workloads (Deployments, StatefulSets, CRDs with a scale subresource)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snooze.sandbox import selectors
from snooze.sandbox.discovery import ResourceSpec
from snooze.sandbox.views import Obj


def walk(obj: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path such as `.spec.replicas`, or None."""
    node: Any = obj
    for part in path.strip(".").split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def assign(obj: Obj, path: str, value: Any) -> None:
    """Set the value at a dotted path, creating the objects on the way."""
    *parents, last = path.strip(".").split(".")
    node = obj
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def scale_of(spec: ResourceSpec, obj: Obj) -> Obj:
    """The Scale (autoscaling/v1) of a workload, read through its spec's scale paths; pure."""
    assert spec.scale is not None
    paths = spec.scale
    if paths.label_selector is None:
        selector = selectors.format_label_selector(walk(obj, ".spec.selector") or {})
    else:
        selector = (walk(obj, paths.label_selector) or "") if paths.label_selector else ""
    meta = obj["metadata"]
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if k in meta
        },
        "spec": {"replicas": walk(obj, paths.spec_replicas) or 0},
        "status": {
            "replicas": walk(obj, paths.status_replicas) or 0,
            **({"selector": selector} if selector else {}),
        },
    }
