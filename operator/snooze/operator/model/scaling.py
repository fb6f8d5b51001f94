"""The second tier, applied: read a model's workload scale, ask the policy, scale it, report it."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from snooze.api.eventreasons import EventReason
from snooze.api.models import EngineState, InferenceModelSpec, Phase, ScaleTargetRef
from snooze.api.reasons import FailureReason
from snooze.kube.api import MERGE_PATCH, KubeApi, NotFound
from snooze.kube.writes import urgent
from snooze.operator.events.emit import Emit
from snooze.operator.memory import ModelMemory
from snooze.operator.metrics import OperatorMetrics
from snooze.policy.scale import ScaleDecision, ScaleKind, ScaleView
from snooze.policy.sleep import EngineView

log = logging.getLogger(__name__)


def workload_path(namespace: str, target: ScaleTargetRef) -> str:
    plural = {"Deployment": "deployments", "StatefulSet": "statefulsets"}[target.kind]
    return f"/apis/{target.api_version}/namespaces/{namespace}/{plural}/{target.name}"


def scale_path(namespace: str, target: ScaleTargetRef) -> str:
    return workload_path(namespace, target) + "/scale"


@dataclass(frozen=True, kw_only=True)
class Workload:
    """The scaleTargetRef workload as the operator reads it: its scale and its pods' labels."""

    replicas: int
    template_labels: Mapping[str, str]


class Scaler:
    """Scales one model's workload through its scale subresource."""

    def __init__(
        self,
        *,
        namespace: str,
        model: str,
        api: KubeApi,
        memory: ModelMemory,
        emit: Emit,
        metrics: OperatorMetrics,
    ) -> None:
        self.namespace = namespace
        self.model = model
        self.api = api
        self.memory = memory
        self.emit = emit
        self.metrics = metrics
        self._missing_reported = False

    async def workload(self, spec: InferenceModelSpec) -> Workload | None:
        """The workload now; None without a target, or when it does not exist.

        One read gives both what ownership is judged by (its pod template's labels) and its
        replicas, so a model with a scaleTargetRef costs one API read a cycle, as before.
        """
        target = spec.scale_target_ref
        if target is None:
            return None
        try:
            body = await self.api.request("GET", workload_path(self.namespace, target))
        except NotFound:
            if not self._missing_reported:
                self.emit(
                    "Warning",
                    EventReason.SCALE_TARGET_NOT_FOUND,
                    f"{target.kind} {target.name} not found: scale to zero is off until it exists",
                )
                self._missing_reported = True
            return None
        self._missing_reported = False
        spec_part = body.get("spec") or {}
        value = spec_part.get("replicas", 1)  # absent means 1, as the API server defaults it
        template = (spec_part.get("template") or {}).get("metadata") or {}
        return Workload(
            replicas=int(value) if isinstance(value, int) else 0,
            template_labels=dict(template.get("labels") or {}),
        )

    def view(
        self,
        spec: InferenceModelSpec,
        engines: Sequence[EngineView],
        *,
        replicas: int | None,
        wake_requested: float | None,
        now: float,
    ) -> ScaleView:
        ready = [e for e in engines if e.ready]
        asleep = (EngineState.ASLEEP, EngineState.FAILED)
        memory = self.memory
        return ScaleView(
            spec=spec,
            replicas=replicas,
            scaled_from=memory.scaled_from,
            scaled_at=memory.scaled_at,
            manual_at=memory.manual_at,
            last_activity=memory.last_activity if memory.last_activity is not None else now,
            all_asleep=bool(ready)
            and all(e.label in asleep and not e.action_running for e in ready),
            wake_requested=wake_requested,
            now=now,
        )

    async def apply(self, decision: ScaleDecision, spec: InferenceModelSpec) -> None:
        target = spec.scale_target_ref
        assert target is not None
        memory, now = self.memory, time.time()
        what = f"{target.kind} {target.name}"
        if decision.kind is ScaleKind.NOTE_MANUAL:
            memory.scaled_from = memory.scaled_at = None
            memory.manual_at = now
            self.emit(
                "Normal",
                EventReason.SCALED_BY_HAND,
                f"{what} was scaled to {decision.replicas} by someone else: left as it is "
                "until the model is next active",
            )
            return
        body = {
            "spec": {"replicas": 0 if decision.kind is ScaleKind.TO_ZERO else decision.replicas}
        }
        # Scaling up is a wake: it goes before the writes of other models' churn.
        with urgent() if decision.kind is ScaleKind.UP else contextlib.nullcontext():
            await self.api.request(
                "PATCH", scale_path(self.namespace, target), body=body, content_type=MERGE_PATCH
            )
        if decision.kind is ScaleKind.TO_ZERO:
            memory.scaled_from, memory.scaled_at = decision.replicas, now
            memory.scale_up_time = None
            self.metrics.tier_transitions.labels(
                self.namespace, self.model, Phase.SCALED_TO_ZERO
            ).inc()
            self.emit(
                "Normal",
                EventReason.SCALED_TO_ZERO,
                f"{what} scaled from {decision.replicas} to 0 replicas: idle longer than "
                f"scaleToZeroAfter ({spec.scale_to_zero_after})",
            )
        else:
            memory.scaled_from = memory.scaled_at = None
            memory.manual_at = None
            memory.scale_up_time = now
            self.metrics.tier_transitions.labels(self.namespace, self.model, Phase.SCALING_UP).inc()
            self.emit(
                "Normal",
                EventReason.SCALING_UP,
                f"{what} scaled back to {decision.replicas} replicas ({decision.reason}); "
                f"engines have wake.coldStartTimeout ({spec.wake.cold_start_timeout}) to answer",
            )

    def check_cold_start(self, spec: InferenceModelSpec, awake: int, now: float) -> None:
        """Report a scale-up whose engines did not answer within wake.coldStartTimeout."""
        started = self.memory.scale_up_time
        if started is None:
            return
        if awake > 0:
            self.metrics.observe_wake(self.namespace, self.model, "cold", now - started)
            self.memory.scale_up_time = None
            self.memory.last_wake_time, self.memory.last_wake_seconds = now, now - started
            self.emit(
                "Normal",
                EventReason.SCALED_UP,
                f"an engine answers {now - started:.1f}s after scale-up",
            )
            return
        if now - started > spec.cold_start_timeout_seconds and self.memory.failure is None:
            message = (
                f"no engine answered within wake.coldStartTimeout ({spec.wake.cold_start_timeout}) "
                "after scale-up: check the pods' events (scheduling, image pull, model load)"
            )
            self.memory.failure = ("", FailureReason.COLD_START_TIMEOUT, message)
            self.metrics.wake_failures.labels(
                self.namespace, self.model, FailureReason.COLD_START_TIMEOUT
            ).inc()
            self.emit("Warning", EventReason.WAKE_FAILED, message)
