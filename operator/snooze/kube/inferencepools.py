"""The Gateway API Inference Extension's InferencePool (`inference.networking.k8s.io/v1`) as
the operator reads it, and the ready addresses behind a Service's EndpointSlices. Pure reads of
what the API returned; whoever wrote the objects is not trusted to have written them well.

Read in the Inference Extension's source, release v1.5.0: `api/v1/inferencepool_types.go` (a
pool's `spec.selector.matchLabels`, `spec.endpointPickerRef` with `group`, `kind`, `name`,
`port`) and `config/charts/epplib/templates/_service.yaml` (the picker's Service names its
metrics port `http-metrics`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from snooze.api.models import GROUP as SNOOZE_GROUP
from snooze.kube.api import Ref

GROUP = "inference.networking.k8s.io"
VERSION = "v1"
PLURAL = "inferencepools"
METRICS_PORT_NAME = "http-metrics"
"""The port of the picker's Service that serves its metrics, as the picker's chart names it."""
PORT_ANNOTATION = f"{SNOOZE_GROUP}/picker-metrics-port"
"""On an InferencePool: the name of its picker Service's metrics port, where it is not
`http-metrics`."""


def pools_ref(namespace: str) -> Ref:
    return Ref(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}")


def services_ref(namespace: str) -> Ref:
    return Ref(f"/api/v1/namespaces/{namespace}/services")


def endpointslices_ref(namespace: str) -> Ref:
    return Ref(f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices")


@dataclass(frozen=True, kw_only=True)
class InferencePool:
    """What the operator needs of one pool."""

    namespace: str
    name: str
    selector: Mapping[str, str] = field(default_factory=dict)
    """Its pods' labels (spec.selector.matchLabels): a pod with all of them is a member."""
    picker: str = ""
    """The Service that spec.endpointPickerRef names."""
    port_name: str = METRICS_PORT_NAME
    """The name of that Service's metrics port."""
    problem: str = ""
    """Why its picker cannot be read ("" when it can): the reference is not to a Service, or
    the pool is malformed."""


def read_pool(body: Mapping[str, Any]) -> InferencePool:
    """An InferencePool as listed by the API; its `problem` says what is wrong with it."""
    meta = _mapping(body.get("metadata"))
    spec = _mapping(body.get("spec"))
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    port_name = _mapping(meta.get("annotations")).get(PORT_ANNOTATION) or METRICS_PORT_NAME
    if not isinstance(port_name, str):
        problem = f"its annotation {PORT_ANNOTATION} is not a port's name"
        return InferencePool(namespace=namespace, name=name, problem=problem)
    labels = _mapping(spec.get("selector")).get("matchLabels")
    ref = _mapping(spec.get("endpointPickerRef"))
    group, kind, picker = ref.get("group") or "", ref.get("kind") or "Service", ref.get("name")
    problem = ""
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        labels, problem = {}, "its spec.selector.matchLabels is not a map of labels"
    elif not isinstance(picker, str) or not picker:
        picker, problem = "", "its spec.endpointPickerRef names no picker"
    elif group != "" or kind != "Service":
        problem = (
            f"its spec.endpointPickerRef names a {kind!s} of group {group!r}: Snooze reads a "
            'picker\'s metrics through a Service (group "", kind Service) only'
        )
    return InferencePool(
        namespace=namespace,
        name=name,
        selector=dict(labels),
        picker="" if problem else str(picker),
        port_name=port_name,
        problem=problem,
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def ready_addresses(
    slices: Iterable[Mapping[str, Any]], port_name: str | None
) -> tuple[list[str], bool]:
    """`host:port` of each ready endpoint of these EndpointSlices, on the port named
    `port_name` (None: the one named `metrics`, else the slice's first), and whether any slice
    has that port. An endpoint whose readiness is not said counts as ready, as the
    EndpointSlice API asks; an IPv6 address is bracketed."""
    found: list[str] = []
    has_port = False
    for piece in slices:
        ports = [p for p in piece.get("ports") or [] if isinstance(p, Mapping)]
        named = [p for p in ports if p.get("name") == (port_name or "metrics")]
        port = named[0] if named else (ports[0] if ports and port_name is None else None)
        if port is None or not isinstance(port.get("port"), int):
            continue
        has_port = True
        for endpoint in piece.get("endpoints") or []:
            if not isinstance(endpoint, Mapping):
                continue
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            for address in endpoint.get("addresses") or []:
                if isinstance(address, str) and address:
                    host = f"[{address}]" if ":" in address else address
                    found.append(f"{host}:{port['port']}")
    return found, has_port
