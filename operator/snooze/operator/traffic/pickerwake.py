"""What a model's loop does with the requests queued for it at its endpoint pickers
(operator/traffic/pickers.py): they count as activity, so that no engine of the model sleeps while
requests wait for it; they ask for a wake once per burst, exactly as a request held at Snooze's
gateway does (the snooze.dev/wake-requested-at annotation, which pools, priorities, wake
checks and scale from zero all follow); and the model's status says whether its pickers can be
read (the PickerReadable condition)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from snooze.api.agreed import WAKE_REQUESTED_ANNOTATION
from snooze.api.conditions import ConditionReason, ConditionType
from snooze.api.eventreasons import EventReason
from snooze.api.models import DesiredState, EngineState, InferenceModelSpec
from snooze.api.times import format_time
from snooze.kube.api import KubeApi, KubeError, models_ref
from snooze.kube.pods import PodInfo
from snooze.operator.events.emit import Emit
from snooze.operator.memory import ModelMemory
from snooze.operator.status.conditions import ConditionValue
from snooze.operator.traffic.pickers import PickerQueues
from snooze.policy.sleep import EngineView
from snooze.policy.wakes import queue_wakes, wake_pending

log = logging.getLogger(__name__)

RECENT = 5.0
"""A wake request this recent is never written again (as the gateway's replicas agree)."""
RETRY = 5.0
"""After a wake request the API refused, the least wait before the next."""


class PickerWaker:
    """One model's side of its endpoint pickers (nothing at all without them)."""

    def __init__(
        self, *, namespace: str, name: str, api: KubeApi, pickers: PickerQueues | None, emit: Emit
    ) -> None:
        self.key = (namespace, name)
        self.api = api
        self.pickers = pickers
        self.emit = emit
        self.asked: float | None = None
        """When this loop last asked for a wake (the model's watch may not show it yet)."""
        self._refused_until = 0.0

    def follow(
        self,
        *,
        pods: Sequence[PodInfo],
        template: Mapping[str, str] | None,
        model_name: str,
        poke: Callable[[], None],
    ) -> None:
        """Have the pickers of the pools that select these pods read for `model_name` (and of
        those that select the pods its workload will make, when it has none: at zero)."""
        if self.pickers is None:
            return
        labels = [p.labels for p in pods] + ([template] if template is not None else [])
        self.pickers.follow(self.key, labels=labels, model_name=model_name, poke=poke)

    def stop(self) -> None:
        if self.pickers is not None:
            self.pickers.forget(self.key)

    async def act(
        self,
        spec: InferenceModelSpec,
        *,
        memory: ModelMemory,
        pods: Sequence[PodInfo],
        views: Sequence[EngineView],
        annotated: float | None,
        now: float,
    ) -> None:
        """Note requests queued at the pickers as activity, and ask for a wake if they call for
        one (`annotated`: the model's wake request as its annotation says)."""
        reading = None if self.pickers is None else self.pickers.reading(self.key)
        if reading is None or not reading.queued:
            return
        memory.last_activity = max(memory.last_activity or 0.0, now)
        for engine in memory.engines.values():
            engine.last_activity = max(engine.last_activity, now)
        if not spec.wake.on_request or spec.desired_state is DesiredState.ASLEEP:
            return  # nothing a request may wake
        awake = sum(
            1 for v in views if v.ready and v.label is EngineState.AWAKE and v.sleeping is False
        )
        slept = [p.sleep_started for p in pods if p.sleep_started is not None]
        if memory.scaled_at is not None:
            slept.append(memory.scaled_at)
        requested = max((t for t in (annotated, self.asked) if t is not None), default=None)
        pending = wake_pending(
            requested_at=requested,
            slept_at=max(slept, default=None),
            now=now,
            wake_timeout=spec.cold_start_timeout_seconds
            if memory.scaled_from is not None
            else spec.wake_timeout_seconds,
            recent=RECENT,
        )
        if now < self._refused_until or not queue_wakes(
            queued=reading.queued, awake=awake, pending=pending
        ):
            return
        patch = {"metadata": {"annotations": {WAKE_REQUESTED_ANNOTATION: format_time(now)}}}
        try:
            await self.api.patch(models_ref(self.key[0]), self.key[1], patch)
        except KubeError as exc:
            self._refused_until = now + RETRY
            log.warning("%s/%s: could not ask for a wake: %s", *self.key, exc)
            return
        self.asked = now
        self.emit(
            "Normal",
            EventReason.WAKE_REQUESTED,
            f"{reading.queued} request(s) queued for it at the endpoint picker of InferencePool "
            f"{', '.join(reading.pools)}: waking it",
        )

    def condition(self) -> ConditionValue | None:
        """PickerReadable, for a model that InferencePools serve (None for one they do not)."""
        reading = None if self.pickers is None else self.pickers.reading(self.key)
        if reading is None:
            return None
        pools = ", ".join(reading.pools)
        if reading.problems:
            said = "; ".join(p.message for p in reading.problems)
            return ConditionValue(
                type=ConditionType.PICKER_READABLE,
                status=False,
                reason=reading.problems[0].reason,
                message=f"{said}. Until it is read, a request queued there may not wake the model",
            )
        if reading.queued is None:
            return None  # not read yet: said at the next status write
        return ConditionValue(
            type=ConditionType.PICKER_READABLE,
            status=True,
            reason=ConditionReason.READ,
            message=f"the picker of InferencePool {pools} is read: a request queued there "
            "wakes the model",
        )
