"""Every (verb, resource) that Snooze's processes use: the chart's RBAC must match it."""

from __future__ import annotations

from dataclasses import dataclass

from snooze.api import models


@dataclass(frozen=True, kw_only=True)
class Permission:
    """One RBAC rule: what it grants and why the code needs it."""

    group: str
    resource: str
    verbs: tuple[str, ...]
    why: str


OPERATOR: tuple[Permission, ...] = (
    Permission(
        group=models.GROUP,
        resource=models.PLURAL,
        verbs=("get", "list", "watch", "patch"),
        why="watch InferenceModels; kopf patches its finalizer and progress annotations",
    ),
    Permission(
        group=models.GROUP,
        resource=f"{models.PLURAL}/status",
        verbs=("get", "patch"),
        why="report phase, engines, wakes and conditions on the status subresource",
    ),
    Permission(
        group=models.GROUP,
        resource="gpupools",
        verbs=("get", "list", "watch", "patch"),
        why="watch GPUPools, whose members share one device; kopf patches its marks on them",
    ),
    Permission(
        group=models.GROUP,
        resource="gpupools/status",
        verbs=("get", "patch"),
        why="report a pool's memory, members, waiting wakes and evictions on its status",
    ),
    Permission(
        group="",
        resource="pods",
        verbs=("get", "list", "watch", "patch", "delete"),
        why="find each model's pods, publish their snooze.dev/state label, and delete a pod "
        "whose engine cannot wake (wake.onFailure: Restart)",
    ),
    Permission(
        group="",
        resource="pods/status",
        verbs=("patch",),
        why="write the snooze.dev/awake condition of pods that list it as a readiness gate, so "
        "that a sleeping engine leaves every Service and InferencePool",
    ),
    Permission(
        group="",
        resource="events",
        verbs=("create", "patch"),
        why="post an Event for each sleep, wake and failure; count its repeats on it",
    ),
    Permission(
        group="apps",
        resource="deployments",
        verbs=("get",),
        why="read a model's scaleTargetRef Deployment: its replicas, and its pod template, "
        "which the model's selector must select before Snooze scales it",
    ),
    Permission(
        group="apps",
        resource="statefulsets",
        verbs=("get",),
        why="read a model's scaleTargetRef StatefulSet: its replicas, and its pod template, "
        "which the model's selector must select before Snooze scales it",
    ),
    Permission(
        group="apps",
        resource="deployments/scale",
        verbs=("patch",),
        why="scale a model's Deployment to zero after scaleToZeroAfter, and back on demand",
    ),
    Permission(
        group="apps",
        resource="statefulsets/scale",
        verbs=("patch",),
        why="scale a model's StatefulSet to zero after scaleToZeroAfter, and back on demand",
    ),
)

# Only with --gateway-service, in the gateway's namespace.
GATEWAY_DISCOVERY: tuple[Permission, ...] = (
    Permission(
        group="discovery.k8s.io",
        resource="endpointslices",
        verbs=("list",),
        why="find the gateway's replicas behind its metrics Service, to read their per-engine "
        "counters instead of probing engines whose requests all pass through the gateway",
    ),
)

GATEWAY: tuple[Permission, ...] = (
    Permission(
        group=models.GROUP,
        resource=models.PLURAL,
        verbs=("list", "watch", "patch"),
        why="know every model (also sleeping ones) by its modelName, and ask for a wake by "
        "merge-patching the snooze.dev/wake-requested-at annotation",
    ),
    Permission(
        group="",
        resource="pods",
        verbs=("list", "watch"),
        why="follow each model's pods, their snooze.dev/state label and address, to route "
        "only to awake ones",
    ),
)

# Only with kopf peering (more than one operator replica): kopf lists and watches its peering
# object to see the other replicas, and patches its own entry into the object's status as a
# keep-alive. ClusterKopfPeering serves a cluster-wide operator, KopfPeering (one per watched
# namespace) a namespaced one; the chart grants the one its mode uses.
PEERING: tuple[Permission, ...] = (
    Permission(
        group="kopf.dev",
        resource="clusterkopfpeerings",
        verbs=("list", "watch", "patch"),
        why="kopf peering, cluster-wide: see the other operator replicas and keep this one's "
        "entry alive, so that only the highest-priority replica acts",
    ),
    Permission(
        group="kopf.dev",
        resource="kopfpeerings",
        verbs=("list", "watch", "patch"),
        why="kopf peering, per watched namespace: see the other operator replicas and keep "
        "this one's entry alive, so that only the highest-priority replica acts",
    ),
)

# Only with --inference-gateway (the chart's inferenceGateway.enabled), where the operator
# watches: a model behind the Gateway API Inference Extension is woken by what its endpoint
# picker queues.
INFERENCE_GATEWAY: tuple[Permission, ...] = (
    Permission(
        group="inference.networking.k8s.io",
        resource="inferencepools",
        verbs=("list",),
        why="find the InferencePools whose selector selects a model's pods, and the endpoint "
        "picker each names",
    ),
    Permission(
        group="",
        resource="services",
        verbs=("get",),
        why="read the Service that an InferencePool's endpointPickerRef names",
    ),
    Permission(
        group="discovery.k8s.io",
        resource="endpointslices",
        verbs=("list",),
        why="find the ready replicas of each endpoint picker behind its Service, to read the "
        "requests queued there",
    ),
)


@dataclass(frozen=True, kw_only=True)
class NonResourcePermission:
    """One RBAC rule on URLs that are no resource (a ClusterRole's only)."""

    urls: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str


# What the endpoint pickers ask of whoever reads their metrics: they check its token with a
# TokenReview, then a SubjectAccessReview for `get` on the non-resource URL /metrics
# (controller-runtime's metrics filter, which the Inference Extension's picker uses, v1.5.0:
# cmd/epp/runner/runner.go). Granted to the ServiceAccount whose token the operator sends, and
# to nothing else.
PICKER_METRICS = NonResourcePermission(
    urls=("/metrics",),
    verbs=("get",),
    why="read the endpoint pickers' metrics, which check this token's right to get /metrics",
)
