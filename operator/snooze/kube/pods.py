"""What the operator and the gateway need to know of a pod, read from its manifest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from snooze.api.agreed import (
    AWAKE_CONDITION,
    POOL_LABEL,
    RELEASED_ANNOTATION,
    SLEEP_LEVEL_ANNOTATION,
    SLEEP_SENT_ANNOTATION,
    SLEEP_STARTED_ANNOTATION,
    STATE_LABEL,
    WAKE_PROGRESS_ANNOTATION,
)
from snooze.api.models import EngineState, InferenceModelSpec
from snooze.api.times import format_time, parse_time
from snooze.kube.serveargs import ServeArgs, serve_args

VLLM_SHARE_FLAG = "--gpu-memory-utilization"
RELEASABLE = frozenset({"paused", "weights", "kv_cache", "cuda_graph"})
"""What the released annotation may name (an SGLang server's tags, and its pause)."""


@dataclass(frozen=True)
class Container:
    """One of a pod's containers, as far as telling its engine's process apart goes."""

    name: str
    ports: frozenset[int]
    """The containerPorts it declares."""
    restarts: int | None
    """Its restartCount; None before the kubelet reports it."""


@dataclass(frozen=True, kw_only=True)
class PodInfo:
    """A pod as far as engines are concerned."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ip: str | None = None
    ready: bool = False
    """Its containers ready, phase Running and not being deleted: the engine has loaded (see
    pod_info for which condition says so)."""
    gated: bool = False
    """It lists the snooze.dev/awake readiness gate: the operator writes that condition."""
    gate: tuple[bool, str] | None = None
    """That condition as the pod shows it, (status is "True", reason); None if it has none."""
    sleep_started: float | None = None
    """When the operator last began to put its engine to sleep (the drain)."""
    sleep_sent: float | None = None
    """When the operator sent /sleep for that drain; None, or older than it, if not yet."""
    wake_steps: frozenset[str] = frozenset()
    """Steps of the wake under way that the engine has done, to resume it without redoing them."""
    sleep_level: int | None = None
    """The level its engine last went to sleep at, from the pod's annotation."""
    released: tuple[int | None, frozenset[str]] | None = None
    """An SGLang server's: what the operator released or paused on it (RELEASED_ANNOTATION),
    with the restart count of the run it was done on; None when nothing is."""
    gpu_memory_utilization: float | None = None
    """The --gpu-memory-utilization its containers pass to vLLM, if any: its share of the GPU."""
    claims: frozenset[str] = frozenset()
    """The ResourceClaims it references (spec.resourceClaims[].resourceClaimName)."""
    scheduled: bool = True
    """Bound to a node (spec.nodeName): only then can it take memory on a device."""
    deleting: bool = False
    """Being deleted: it holds its memory until it is gone."""
    containers: tuple[Container, ...] = ()
    serve: ServeArgs = field(default_factory=ServeArgs)
    """What its containers' `vllm serve` arguments say (LoRA, tensor and pipeline parallel)."""
    resource_version: str = field(default="", compare=False)
    """The version of the pod this was read from: tells a stale copy from a fresh one."""

    def engine_restarts(self, port: int) -> int | None:
        """restartCount of the container that runs the engine serving on `port`: a new count
        is a new engine process. That container is the one that declares the port, or else
        the pod's only container. None when the pod does not tell (several containers and
        none, or two, declaring the port; no status yet): whatever the engine's process
        holds is then taken to last as long as the pod. Nothing else in the spec is read,
        so a sidecar that names vLLM cannot pass its restarts off as the engine's."""
        declaring = [c for c in self.containers if port in c.ports]
        if len(declaring) == 1:
            return declaring[0].restarts
        if not declaring and len(self.containers) == 1:
            return self.containers[0].restarts
        return None

    @property
    def state(self) -> EngineState | None:
        try:
            return EngineState(self.labels.get(STATE_LABEL, ""))
        except ValueError:
            return None


def pod_info(body: Mapping[str, Any]) -> PodInfo:
    """Read a pod manifest (a dict, or kopf's body) into a PodInfo."""
    meta = body.get("metadata", {})
    status = body.get("status", {}) or {}
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    gates = [
        g.get("conditionType")
        for g in (body.get("spec") or {}).get("readinessGates") or []
        if isinstance(g, Mapping)
    ]
    # The kubelet makes a pod Ready when its containers are ready and every readiness gate's
    # condition is True. A pod with gates is judged by its containers alone: the engine has
    # loaded once they are ready, and the operator's own gate keeps such a pod NotReady
    # while its engine sleeps. Without gates, Ready is ContainersReady.
    loaded = "ContainersReady" if gates else "Ready"
    ready = (
        any(c.get("type") == loaded and c.get("status") == "True" for c in conditions)
        and status.get("phase") == "Running"
        and not meta.get("deletionTimestamp")
        and bool(status.get("podIP"))
    )
    annotations = meta.get("annotations") or {}
    return PodInfo(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        labels=dict(meta.get("labels") or {}),
        ip=status.get("podIP") or None,
        ready=ready,
        gated=AWAKE_CONDITION in gates,
        gate=next(
            (
                (c.get("status") == "True", str(c.get("reason") or ""))
                for c in conditions
                if c.get("type") == AWAKE_CONDITION
            ),
            None,
        ),
        sleep_started=parse_time(annotations.get(SLEEP_STARTED_ANNOTATION)),
        sleep_sent=parse_time(annotations.get(SLEEP_SENT_ANNOTATION)),
        wake_steps=frozenset(
            step for step in str(annotations.get(WAKE_PROGRESS_ANNOTATION) or "").split(",") if step
        ),
        sleep_level=_level(annotations.get(SLEEP_LEVEL_ANNOTATION)),
        released=_released(annotations.get(RELEASED_ANNOTATION)),
        gpu_memory_utilization=_share(body.get("spec") or {}),
        scheduled=bool((body.get("spec") or {}).get("nodeName")) or bool(status.get("podIP")),
        deleting=bool(meta.get("deletionTimestamp")),
        containers=_containers(body.get("spec") or {}, status),
        serve=serve_args(body.get("spec") or {}),
        resource_version=str(meta.get("resourceVersion") or ""),
        claims=frozenset(
            str(claim.get("resourceClaimName"))
            for claim in (body.get("spec") or {}).get("resourceClaims") or []
            if isinstance(claim, Mapping) and claim.get("resourceClaimName")
        ),
    )


def condition_patch(
    kind: str, *, status: bool, reason: str, message: str, since: float | None
) -> dict[str, Any]:
    """A strategic merge patch of pods/status that writes the pod's condition `kind` and leaves
    the others (the kubelet's) as they are; `since`: its lastTransitionTime, None to keep the
    one it has."""
    condition = {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
    }
    if since is not None:
        condition["lastTransitionTime"] = format_time(since)
    return {"status": {"conditions": [condition]}}


def _containers(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[Container, ...]:
    restarts = {
        c.get("name"): c.get("restartCount")
        for c in status.get("containerStatuses") or []
        if isinstance(c, Mapping)
    }
    found = []
    for container in spec.get("containers") or []:
        if not isinstance(container, Mapping):
            continue
        ports = frozenset(
            p["containerPort"]
            for p in container.get("ports") or []
            if isinstance(p, Mapping) and isinstance(p.get("containerPort"), int)
        )
        count = restarts.get(container.get("name"))
        name = str(container.get("name") or "")
        found.append(Container(name, ports, count if isinstance(count, int) else None))
    return tuple(found)


def _released(text: object) -> tuple[int | None, frozenset[str]] | None:
    """`RESTARTS:TAG,TAG`; None for anything else (a pod's owner can write anything here)."""
    if not isinstance(text, str) or len(text) > 100 or ":" not in text:
        return None
    count, _, listed = text.partition(":")
    tags = frozenset(t for t in listed.split(",") if t)
    if not tags or not tags <= RELEASABLE:
        return None
    if count == "":
        return None, tags
    return (int(count), tags) if count.isdigit() and len(count) < 10 else None


def released_text(restarts: int | None, outstanding: frozenset[str]) -> str | None:
    """The annotation's value for what is outstanding on a run (None: nothing is)."""
    if not outstanding:
        return None
    return f"{'' if restarts is None else restarts}:{','.join(sorted(outstanding))}"


def _level(text: object) -> int | None:
    return int(text) if isinstance(text, str) and text in ("0", "1", "2") else None


def _share(spec: Mapping[str, Any]) -> float | None:
    """The value of vLLM's --gpu-memory-utilization in the pod's containers' command or args."""
    for container in spec.get("containers") or []:
        words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
        for i, word in enumerate(words):
            value: str | None = None
            if word == VLLM_SHARE_FLAG and i + 1 < len(words):
                value = words[i + 1]
            elif word.startswith(VLLM_SHARE_FLAG + "="):
                value = word.split("=", 1)[1]
            if value is not None:
                try:
                    share = float(value)
                except ValueError:
                    continue
                if 0 < share <= 1:
                    return share
    return None


def pool_name_of(
    pod: PodInfo, spec: InferenceModelSpec | None, claims: Mapping[str, str]
) -> str | None:
    """The pool a pod is a member of: its snooze.dev/pool label, else the pool whose
    ResourceClaim it references (`claims`: claim name -> pool), else its model's spec.pool."""
    label = pod.labels.get(POOL_LABEL)
    if label:
        return label
    for claim in sorted(pod.claims):
        if claim in claims:
            return claims[claim]
    return None if spec is None or spec.pool is None else spec.pool.name
