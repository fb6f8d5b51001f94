"""Sample the running demo into a timeline: pods, models, wakes, and what went wrong when."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from snooze.api.agreed import STATE_LABEL
from snooze.api.conditions import ConditionType
from snooze.api.eventreasons import EventReason
from snooze.api.gpupool import GPUPoolStatus, parse_pool_status
from snooze.api.models import EngineState
from snooze.api.modelstatus import InferenceModelStatus, parse_status
from snooze.demo import timeline
from snooze.demo.controller import ReplicaSetStandIn
from snooze.demo.timeline import Shown
from snooze.gateway.embedded import GatewayThread
from snooze.kube.pods import pod_info
from snooze.operator.events.correlation import COMBINED
from snooze.operator.metrics import OperatorMetrics

NS = "default"
MODELS = f"/apis/snooze.dev/v1alpha1/namespaces/{NS}/inferencemodels"
POOLS = f"/apis/snooze.dev/v1alpha1/namespaces/{NS}/gpupools"
PODS = f"/api/v1/namespaces/{NS}/pods"
EVENTS = f"/api/v1/namespaces/{NS}/events"
# The pool's Event for each member it puts to sleep (operator/pool/loop.py words it).
MAKING_ROOM = re.compile(r"^(?P<pod>\S+) \((?P<model>[^)]*)\) sleeps to make room for (?P<for>.+)$")
# Operator counters whose every increment is an incident, and what it is called then.
INCIDENTS = {
    "snooze_wake_failures_total": "wake failed",
    "snooze_sleep_failures_total": "sleep failed",
    "snooze_pod_restarts_total": "pod restarted",
}


def metric_total(metrics: OperatorMetrics, name: str, model: str) -> float:
    """A sample's value summed over every label but the model (all levels, all reasons)."""
    total = 0.0
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and sample.labels.get("model") == model:
                total += sample.value
    return total


def pool_total(metrics: OperatorMetrics, name: str, pool: str, reason: str | None = None) -> float:
    """A pool's sample in namespace NS, of one `reason` or summed over all."""
    total = 0.0
    for family in metrics.registry.collect():
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == name
                and (labels.get("namespace"), labels.get("pool")) == (NS, pool)
                and reason in (None, labels.get("reason"))
            ):
                total += sample.value
    return total


def counts(metrics: OperatorMetrics) -> dict[tuple[str, str, str], float]:
    """(counter, model, reason) -> value, for the counters in INCIDENTS."""
    found: dict[tuple[str, str, str], float] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name in INCIDENTS:
                key = (sample.name, sample.labels["model"], sample.labels.get("reason", ""))
                found[key] = sample.value
    return found


def incidents_between(
    before: Mapping[tuple[str, str, str], float],
    after: Mapping[tuple[str, str, str], float],
    *,
    t: float,
) -> list[timeline.Incident]:
    """One Incident per increment of a counter from `before` to `after` (pure)."""
    found = []
    # Failures before remedies when both are seen at once: in INCIDENTS' order.
    order = list(INCIDENTS)
    for (name, model, reason), value in sorted(
        after.items(), key=lambda item: (order.index(item[0][0]), item[0][1:])
    ):
        for _ in range(round(value - before.get((name, model, reason), 0.0))):
            found.append(timeline.Incident(t=t, model=model, what=INCIDENTS[name], reason=reason))
    return found


class Sampler:
    """Samples the cluster into a timeline, and turns the wake metric into wake durations."""

    def __init__(
        self,
        *,
        api: httpx.AsyncClient,
        controller: ReplicaSetStandIn,
        gateway: GatewayThread,
        metrics: OperatorMetrics,
        models: list[str],
        pools: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.api = api
        self.controller = controller
        self.gateway = gateway
        self.metrics = metrics
        self.models = models
        self.pools = dict(pools or {})
        """Each GPU pool's member models."""
        self.timeline = timeline.Timeline()
        self._events_seen: set[str] = set()
        self._seen = set(models)
        self._wakes_seen = 0.0  # when the last wake taken happened
        self._counts = counts(metrics)
        self._failed: set[str] = set()
        """Pods whose wake failed: drawn as failed for as long as they exist."""

    async def sample(self, t: float) -> timeline.Sample:
        pods_body = (await self.api.get(PODS)).json()
        models_body = (await self.api.get(MODELS)).json()
        held = await self.gateway.held()
        engines = self.controller.engines
        pods: dict[str, timeline.PodSample] = {}
        for pod in pods_body.get("items", []):
            meta = pod["metadata"]
            model = (meta.get("labels") or {}).get("app")
            if model is None or meta.get("deletionTimestamp"):
                continue
            engine = engines.get(meta["name"])
            pods[meta["name"]] = timeline.PodSample(
                model=model,
                state=pod_state(pod),
                gpu_bytes=engine.gpu_memory_bytes if engine is not None else 0,
            )
        models: dict[str, timeline.ModelSample] = {}
        for item in models_body.get("items", []):
            name = item["metadata"]["name"]
            status = parse_status(item.get("status"))
            models[name] = timeline.ModelSample(
                # "" until the operator has written one: the view shows "-".
                phase=status.phase.value if "phase" in status.model_fields_set else "",
                awake=status.awake,
                asleep=status.asleep,
                held=held.get(name, 0),
                last_wake_time=status.last_wake_time,
                last_wake_seconds=status.last_wake_seconds,
                waiting_for_room=waiting_for_room(status),
            )
        self._wakes(t)
        incidents = self._incidents(t, pods)
        pools = await self._pools(pods)
        swaps = await self._swaps(t) if self.pools else []
        pods = {
            name: timeline.failed(pod) if name in self._failed else pod
            for name, pod in pods.items()
        }
        self._failed &= set(pods)
        sample = timeline.Sample(
            t=t,
            pods=pods,
            models=models,
            incidents=tuple(incidents),
            pools=pools,
            swaps=tuple(swaps),
        )
        self.timeline.add(sample)
        return sample

    async def _pools(
        self, pods: Mapping[str, timeline.PodSample]
    ) -> dict[str, timeline.PoolSample]:
        """Each pool's device as the simulated GPU counts it, beside the pool's own count."""
        if not self.pools:
            return {}
        statuses = {
            item["metadata"]["name"]: parse_pool_status(item.get("status"))
            for item in (await self.api.get(POOLS)).json().get("items", [])
        }
        found = {}
        for name, members in self.pools.items():
            device = self.controller.sim.devices.get(name)
            if device is None:
                continue
            status = statuses.get(name) or GPUPoolStatus()
            found[name] = timeline.PoolSample(
                memory_bytes=device.total_bytes,
                held={m: sum(p.gpu_bytes for p in pods.values() if p.model == m) for m in members},
                counted_bytes=status.used_bytes,
                waiting=tuple(status.waiting_models),
            )
        return found

    async def _swaps(self, t: float) -> list[timeline.Swap]:
        """The MakingRoom Events not seen before: who was put to sleep for whom."""
        response = await self.api.get(EVENTS, params={"fieldSelector": "reason=MakingRoom"})
        found = []
        for event in response.json().get("items", []):
            # An Event said again is the same object with a higher count: a swap again.
            name = f"{event['metadata']['name']}#{event.get('count') or 1}"
            if name in self._events_seen:
                continue
            self._events_seen.add(name)
            swap = parse_swap(event, t=t)
            if swap is not None and swap.pool in self.pools:
                found.append(swap)
        self.timeline.swaps.extend(found)
        return found

    def _wakes(self, t: float) -> None:
        # The operator keeps each wake exactly (OperatorMetrics.wakes); take the new ones.
        fresh = [w for w in self.metrics.wakes if w.at > self._wakes_seen]
        for wake in fresh:
            self._wakes_seen = max(self._wakes_seen, wake.at)
            if wake.model in self._seen:
                self.timeline.wakes.setdefault(wake.model, []).append((t, wake.seconds))

    def _incidents(
        self, t: float, pods: Mapping[str, timeline.PodSample]
    ) -> list[timeline.Incident]:
        now = counts(self.metrics)
        found = [i for i in incidents_between(self._counts, now, t=t) if i.model in self._seen]
        self._counts = now
        for incident in found:
            self.timeline.incidents.append(incident)
            if incident.what == "wake failed":
                self._failed |= self._failing_pods(incident.model, pods)
        return found

    def _failing_pods(self, model: str, pods: Mapping[str, timeline.PodSample]) -> set[str]:
        """The model's pod that was waking: still here, or (already restarted) in the last
        sample, which is then redrawn as failed."""

        def in_state(sample_pods: Mapping[str, timeline.PodSample], state: str) -> set[str]:
            return {n for n, p in sample_pods.items() if p.model == model and p.state == state}

        def waking(sample_pods: Mapping[str, timeline.PodSample]) -> set[str]:
            # A wake that fails fast may never be sampled waking: the pod was asleep before.
            return in_state(sample_pods, "waking") or in_state(sample_pods, "asleep")

        here = waking(pods)
        if here:
            return here
        last = self.timeline.samples[-1] if self.timeline.samples else None
        if last is not None:
            gone = waking(last.pods)
            self.timeline.samples[-1] = timeline.with_failed(last, gone)
        return set()


def pod_state(pod: Mapping[str, Any]) -> str:
    """The pod's published state, or `loading` until it is Ready (pure)."""
    info = pod_info(pod)
    return str(info.labels.get(STATE_LABEL) or EngineState.AWAKE) if info.ready else Shown.LOADING


def waiting_for_room(status: InferenceModelStatus) -> str | None:
    """The message of a model's WaitingForRoom condition while it is True (pure)."""
    for condition in status.conditions:
        if condition.type == ConditionType.WAITING_FOR_ROOM and condition.status == "True":
            return condition.message or "waiting for room on its GPU pool"
    return None


def parse_swap(event: Mapping[str, Any], *, t: float) -> timeline.Swap | None:
    """A MakingRoom Event as a Swap, or None if it is worded otherwise (pure)."""
    # Similar Events said often are combined under one, which tells the latest.
    match = MAKING_ROOM.match(str(event.get("message") or "").removeprefix(COMBINED))
    if event.get("reason") != EventReason.MAKING_ROOM or match is None:
        return None
    return timeline.Swap(
        t=t,
        pool=str((event.get("involvedObject") or {}).get("name") or ""),
        pod=match["pod"],
        model=match["model"],
        making_room_for=match["for"],
    )
