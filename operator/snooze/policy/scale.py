"""The scale-to-zero decision: after long idleness a model's workload goes to zero replicas, and
a wake request brings it back to the replicas it had."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from snooze.api.models import DesiredState, InferenceModelSpec
from snooze.policy.sleep import ActionReason


class ScaleKind(StrEnum):
    TO_ZERO = "ScaleToZero"
    """Remember the workload's replicas and scale it to zero."""
    UP = "ScaleUp"
    """Scale the workload back to the replicas it had."""
    NOTE_MANUAL = "NoteManualScale"
    """Someone else changed the scale: stop managing it for this idle period."""


@dataclass(frozen=True, kw_only=True)
class ScaleView:
    """The model-level facts the scale decision needs."""

    spec: InferenceModelSpec
    replicas: int | None
    """The workload's replicas now; None when it has no scaleTargetRef or cannot be read."""
    scaled_from: int | None
    """Set while Snooze holds the workload at zero: the replicas to restore."""
    scaled_at: float | None
    manual_at: float | None
    """When someone else last scaled the workload (see ScaleKind.NOTE_MANUAL)."""
    last_activity: float
    """The model's latest activity, across every engine it has had."""
    all_asleep: bool
    """Every ready engine sleeps, none is acting: the first tier is reached."""
    wake_requested: float | None
    now: float


@dataclass(frozen=True, kw_only=True)
class ScaleDecision:
    kind: ScaleKind
    replicas: int
    reason: str


def decide_scale(view: ScaleView) -> ScaleDecision | None:
    """Whether to scale the model's workload to zero, back up, or note a hand-made change."""
    spec, replicas = view.spec, view.replicas
    if replicas is None or spec.scale_target_ref is None:
        return None
    wake = spec.wake.on_request and view.wake_requested is not None
    if view.scaled_from is not None:
        # Snooze holds it at zero.
        if replicas > 0:
            return ScaleDecision(
                kind=ScaleKind.NOTE_MANUAL, replicas=replicas, reason=ActionReason.SCALED_BY_HAND
            )
        since = view.scaled_at if view.scaled_at is not None else view.last_activity
        wanted = (
            spec.desired_state is DesiredState.AWAKE
            or spec.min_awake > 0
            or spec.scale_to_zero_after is None
            or (
                spec.desired_state is not DesiredState.ASLEEP
                and wake
                and view.wake_requested is not None
                and view.wake_requested > since
            )
        )
        if wanted:
            return ScaleDecision(
                kind=ScaleKind.UP, replicas=max(view.scaled_from, 1), reason=_up_reason(view)
            )
        return None
    if replicas == 0:
        # At zero by someone else's hand: left so until a request asks for the model.
        if view.manual_at is None:
            return ScaleDecision(
                kind=ScaleKind.NOTE_MANUAL, replicas=0, reason=ActionReason.SCALED_BY_HAND
            )
        if wake and view.wake_requested is not None and view.wake_requested > view.manual_at:
            return ScaleDecision(kind=ScaleKind.UP, replicas=1, reason=ActionReason.WAKE_REQUESTED)
        return None
    after = spec.scale_to_zero_after_seconds
    if (
        after is None
        or spec.desired_state is not DesiredState.AUTO
        or spec.min_awake > 0
        or not view.all_asleep
        or view.now - view.last_activity < after
    ):
        return None
    if view.manual_at is not None and view.manual_at >= view.last_activity:
        return None  # scaled by hand during this idle period: not undone
    if view.wake_requested is not None and view.wake_requested > view.last_activity:
        return None  # wanted since it was last active
    return ScaleDecision(kind=ScaleKind.TO_ZERO, replicas=replicas, reason=ActionReason.IDLE)


def _up_reason(view: ScaleView) -> str:
    if view.spec.desired_state is DesiredState.AWAKE:
        return ActionReason.DESIRED_AWAKE
    if view.spec.min_awake > 0:
        return ActionReason.MIN_AWAKE
    if view.spec.scale_to_zero_after is None:
        return ActionReason.SCALE_TO_ZERO_DISABLED
    return ActionReason.WAKE_REQUESTED
