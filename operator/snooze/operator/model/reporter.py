"""A model's status on the API: written when it changed (activity alone at most once per status
interval), an invalid spec told once, and the metrics that follow the status."""

from __future__ import annotations

import contextlib
import math
import time

from snooze.api.eventreasons import EventReason
from snooze.api.models import DesiredState, EngineState, InferenceModelSpec
from snooze.api.modelstatus import InferenceModelStatus, merge_patch
from snooze.api.times import moment
from snooze.kube.api import KubeApi, models_ref
from snooze.kube.pods import PodInfo
from snooze.kube.writes import WriteYielded, urgent
from snooze.operator.events.emit import Emit
from snooze.operator.memory import ModelMemory
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.model.foresight import Foresight
from snooze.operator.settings import Settings
from snooze.operator.status import model as status


class StatusReporter:
    """Writes one model's status, as its loop decided it."""

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        api: KubeApi,
        settings: Settings,
        emit: Emit,
        metrics: OperatorMetrics,
        memory: ModelMemory,
        foresight: Foresight,
        written: InferenceModelStatus,
    ) -> None:
        self.namespace, self.name = namespace, name
        self.api, self.settings, self.emit, self.metrics = api, settings, emit, metrics
        self.memory, self.foresight = memory, foresight
        self.written = written
        """The status as last written (or found at start)."""
        self._written_at = -math.inf
        self._counted_at: float | None = None
        self._invalid: str | None = None
        """The invalid spec's message last told by Event, until the spec is valid again."""

    async def invalid(self, message: str, generation: int | None, now: float) -> None:
        if message != self._invalid:
            self.emit("Warning", EventReason.INVALID_SPEC, message)
            self._invalid = message
        # An invalid spec claims no model name: it must not keep a valid model from its own.
        new = status.build(
            model_name="",
            pods=[],
            memory=self.memory,
            previous=self.written,
            generation=generation,
            now=now,
            spec_error=message,
        )
        await self._patch(new)

    def valid(self) -> None:
        """The spec is valid: say so once if it was not."""
        if self._invalid is not None:
            self.emit("Normal", EventReason.SPEC_VALID, "the spec is valid again; resuming")
            self._invalid = None

    async def write(
        self,
        spec: InferenceModelSpec,
        pods: list[PodInfo],
        generation: int | None,
        now: float,
        *,
        replicas: int | None,
        conflicts: status.Conflicts,
        waiting: str | None,
        picker: status.ConditionValue | None = None,
    ) -> None:
        new = status.build(
            model_name=spec.model_name or self.name,
            pods=pods,
            memory=self.memory,
            previous=self.written,
            generation=generation,
            now=now,
            replicas=replicas,
            conflicts=conflicts,
            waiting_for_room=waiting,
            selector=spec.selector.to_label_selector(),
            namespace=self.namespace,
            can_wake=spec.desired_state is DesiredState.AWAKE
            or (spec.desired_state is DesiredState.AUTO and spec.wake.on_request),
            verify=spec.wake.verify,
            picker=picker,
        )
        new = self.foresight.report(new, spec, now)
        self._count(pods, new.phase.value, now)
        await self._patch(new)

    def _count(self, pods: list[PodInfo], phase: str, now: float) -> None:
        """Publish engine states and phase, and add the engine-seconds asleep since last time."""
        states = {p.name: (p.state.value if p.ready and p.state else None) for p in pods}
        self.metrics.set_engine_states(self.namespace, self.name, states)
        self.metrics.set_phase(self.namespace, self.name, phase)
        if self._counted_at is not None:
            asleep = sum(1 for p in pods if p.ready and p.state is EngineState.ASLEEP)
            if asleep:
                self.metrics.asleep_seconds.labels(self.namespace, self.name).inc(
                    asleep * (now - self._counted_at)
                )
        self._counted_at = now

    async def _patch(self, new: InferenceModelStatus) -> None:
        if new == self.written:
            return  # nothing changed: no API write
        now = time.monotonic()
        if (
            status.only_activity_moved(self.written, new)
            and now - self._written_at < self.settings.status_interval
        ):
            # A busy model's activity times move at every probe: written at most once per
            # status interval, so that API writes do not grow with traffic.
            return
        new = new.model_copy(update={"activity_written_time": moment(time.time())})
        # One that publishes an engine awake is what a gateway holding requests waits for.
        # One that waits for its namespace's budget gives way when the loop is poked (a wake
        # asked, a step ended): the next cycle writes the status as it is then.
        try:
            with urgent() if new.awake > self.written.awake else contextlib.nullcontext():
                await self.api.patch(
                    models_ref(self.namespace),
                    self.name,
                    {"status": merge_patch(new)},
                    sub="status",
                    yield_to=self.memory.poke,
                )
        except WriteYielded:
            return
        self.written = new
        self._written_at = now
