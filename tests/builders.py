"""Pods, InferenceModels and GPUPools for the tests: manifests, and PodInfo as read from one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snooze.api import gpupool, models
from snooze.api.agreed import STATE_LABEL
from snooze.kube.pods import PodInfo

CONTAINER: Mapping[str, Any] = {"name": "c", "image": "i"}
"""A pod's one container when a test names none."""


def pod(
    *containers: Mapping[str, Any],
    name: str = "p",
    namespace: str | None = None,
    uid: str | None = None,
    labels: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
    status: Mapping[str, Any] | None = None,
    **metadata: Any,
) -> dict[str, Any]:
    """A Pod's manifest: one container (CONTAINER) unless `containers` are given; `spec` adds to
    its spec, `metadata` to its metadata. No namespace, uid or labels unless given, as a client
    that creates a pod sends it."""
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if uid is not None:
        meta["uid"] = uid
    if labels is not None:
        meta["labels"] = dict(labels)
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta | metadata,
        "spec": {"containers": [dict(c) for c in containers or [CONTAINER]], **(spec or {})},
    }
    if status is not None:
        body["status"] = dict(status)
    return body


def running(ip: str = "10.0.0.1", *conditions: Mapping[str, Any]) -> dict[str, Any]:
    """A pod's status once the kubelet runs it: phase Running, its address, these conditions."""
    return {"phase": "Running", "podIP": ip, "conditions": [dict(c) for c in conditions]}


def pod_info(
    name: str = "chat-0",
    *,
    namespace: str = "ns",
    uid: str | None = None,
    state: str | None = None,
    labels: Mapping[str, str] | None = None,
    ip: str | None = "127.0.0.1",
    ready: bool = True,
    **fields: Any,
) -> PodInfo:
    """A pod as the operator and the gateway read it: ready at `ip`, its uid its name unless
    given; `state` is its snooze.dev/state label, beside `labels`."""
    found = dict(labels or {}) | ({STATE_LABEL: state} if state is not None else {})
    return PodInfo(
        namespace=namespace,
        name=name,
        uid=uid if uid is not None else name,
        labels=found,
        ip=ip,
        ready=ready,
        **fields,
    )


def model(
    name: str = "m",
    *,
    namespace: str | None = None,
    match_labels: Mapping[str, str] | None = None,
    status: Mapping[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """An InferenceModel's manifest selecting its pods by `match_labels` (`app: NAME` unless
    given); `spec` adds to its spec, or replaces the selector, in the manifest's own words."""
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    body: dict[str, Any] = {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": meta,
        "spec": {
            "selector": {
                "matchLabels": dict({"app": name} if match_labels is None else match_labels)
            },
            **spec,
        },
    }
    if status is not None:
        body["status"] = dict(status)
    return body


def gpu_pool(name: str = "gpu-0", memory: str = "70Gi", **spec: Any) -> dict[str, Any]:
    """A GPUPool's manifest: one device of `memory`; `spec` adds to its spec (camelCase)."""
    return {
        "apiVersion": models.API_VERSION,
        "kind": gpupool.KIND,
        "metadata": {"name": name},
        "spec": {"memory": memory, **spec},
    }
