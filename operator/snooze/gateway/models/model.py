"""One InferenceModel as the gateway reads it: its spec, and what the operator reported.

The gateway trusts a model's status (the operator alone may write it) and never a label or
annotation that a pod's owner could set alone: the name a model is routed by, the pods it may
be routed to and a known wake failure all come from the status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from snooze.api.agreed import WAKE_REQUESTED_ANNOTATION
from snooze.api.conditions import ConditionReason, ConditionType
from snooze.api.models import (
    DesiredState,
    EngineState,
    InferenceModelSpec,
    Phase,
    SpecError,
    parse_spec,
)
from snooze.api.modelstatus import Condition, PodStatus, parse_status
from snooze.api.times import parse_time, seconds_of
from snooze.kube.pods import PodInfo

Key = tuple[str, str]


def vouches_for(entry: PodStatus, pod: PodInfo) -> bool:
    """Whether a `status.pods` entry speaks of this very pod: the same uid, when the operator
    wrote one (a pod recreated under the same name is not the one the operator saw)."""
    return not entry.uid or entry.uid == pod.uid


@dataclass(frozen=True, kw_only=True)
class WakeFailure:
    """The model's `WakeFailed` condition while it is True."""

    reason: str
    message: str
    since: float | None


@dataclass(frozen=True, kw_only=True)
class Model:
    """One InferenceModel as the gateway needs it."""

    namespace: str
    name: str
    model_name: str
    """The name its spec asks for (spec.modelName, or metadata.name)."""
    spec: InferenceModelSpec | None
    """None when the spec is invalid; `spec_error` then says why."""
    spec_error: str = ""
    wake_requested_at: float | None = None
    phase: str = "Pending"
    last_wake_seconds: float | None = None
    scaled_to_zero_at: float | None = None
    """When the operator scaled the model's workload to zero (status.scaledToZeroTime)."""
    claimed_name: str | None = None
    """status.modelName: the name the operator routes this model by, once it has written it."""
    conflict: str | None = None
    """The message of a `Conflict` condition that is True: another model holds the name."""
    status_pods: Mapping[str, PodStatus] = field(default_factory=dict)
    """`status.pods` by pod name."""
    wake_failure: WakeFailure | None = None
    operator_refusal: str | None = None
    """The message of a SpecValid condition the operator set False: something only it can
    check (such as a scaleTargetRef the model does not own) keeps it from acting."""
    waiting_for_room: str | None = None
    """The message of a WaitingForRoom condition that is True: its wake waits for its GPU
    pool to make room."""
    no_pods: bool = False
    """The operator found that its selector matches no pod (Ready False, NoPods), for the spec
    as it stands (the condition's observedGeneration is the model's generation)."""

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @property
    def at_zero(self) -> bool:
        """Its workload is at zero replicas or coming back: a wake is a cold start."""
        return self.phase in (Phase.SCALED_TO_ZERO.value, Phase.SCALING_UP.value)

    def holds(self, name: str) -> bool:
        """Whether the operator routes `name` to this model (it claims it, unchallenged)."""
        return self.claimed_name == name and self.conflict is None

    def vouched_awake(self, pod: PodInfo) -> bool:
        """Whether the operator's status lists this very pod (same uid, when known) awake."""
        entry = self.status_pods.get(pod.name)
        return entry is not None and entry.state == EngineState.AWAKE and vouches_for(entry, pod)

    def failed_pod(self, pod: PodInfo) -> PodStatus | None:
        """The status entry of a pod whose wake failed (label or status `failed`), else None."""
        entry = self.status_pods.get(pod.name)
        if entry is not None and not vouches_for(entry, pod):
            entry = None
        failed = pod.state is EngineState.FAILED or (
            entry is not None and entry.state == EngineState.FAILED
        )
        if not failed:
            return None
        return entry or PodStatus(name=pod.name, state=EngineState.FAILED)

    def hold_seconds(self) -> float:
        """How long a request may wait for this model: a wake, or a cold start from zero."""
        assert self.spec is not None
        if self.at_zero:
            return self.spec.cold_start_timeout_seconds
        return self.spec.wake_timeout_seconds

    def hold_limit_name(self) -> str:
        assert self.spec is not None
        if self.at_zero:
            return f"wake.coldStartTimeout ({self.spec.wake.cold_start_timeout})"
        return f"wake timeout ({self.spec.wake.timeout})"

    def refusal(self) -> str | None:
        """Why a request must not wait for this model to wake, or None if it may."""
        if self.spec is None:
            return f"model {self.model_name!r} has an invalid spec: {self.spec_error}"
        if self.operator_refusal is not None:
            return f"model {self.model_name!r} has an invalid spec: {self.operator_refusal}"
        if self.spec.desired_state is DesiredState.ASLEEP:
            return (
                f"model {self.model_name!r} is asleep on purpose (spec.desiredState: Asleep); "
                "set desiredState to Auto or Awake to use it"
            )
        if not self.spec.wake.on_request:
            return (
                f"model {self.model_name!r} is asleep and does not wake on request "
                "(spec.wake.onRequest: false); wake it by hand or set onRequest to true"
            )
        return None


def model_from(body: Mapping[str, Any]) -> Model:
    """Read an InferenceModel manifest; an invalid spec is kept (listed, refused), never raised,
    and its status is read as the operator reads it (parse_status: what cannot be read is
    dropped, the rest kept)."""
    meta = body.get("metadata") or {}
    raw_spec = body.get("spec") or {}
    spec: InferenceModelSpec | None
    try:
        spec, error = parse_spec(raw_spec), ""
    except SpecError as exc:
        spec, error = None, str(exc)
    name = str(meta.get("name", ""))
    model_name = (spec.model_name if spec else raw_spec.get("modelName")) or name
    annotations = meta.get("annotations") or {}
    status = parse_status(body.get("status"))
    conditions = {c.type: c for c in status.conditions}
    failed = _true(conditions, ConditionType.WAKE_FAILED)
    valid = conditions.get(ConditionType.SPEC_VALID)
    ready = conditions.get(ConditionType.READY)
    generation = meta.get("generation")
    if "phase" in status.model_fields_set:
        phase = status.phase.value
    else:
        phase = Phase.PENDING.value if spec is not None else "Invalid"
    return Model(
        namespace=str(meta.get("namespace", "")),
        name=name,
        model_name=str(model_name),
        spec=spec,
        spec_error=error,
        wake_requested_at=parse_time(annotations.get(WAKE_REQUESTED_ANNOTATION)),
        phase=phase,
        last_wake_seconds=status.last_wake_seconds,
        scaled_to_zero_at=_seconds(status.scaled_to_zero_time),
        claimed_name=status.model_name or None,
        conflict=_message(conditions, ConditionType.CONFLICT, "the model name is taken"),
        status_pods={entry.name: entry for entry in status.pods},
        wake_failure=WakeFailure(
            reason=failed.reason,
            message=failed.message,
            since=seconds_of(failed.last_transition_time),
        )
        if failed is not None
        else None,
        # Only for a spec the gateway itself reads as valid: the operator's own reasons.
        operator_refusal=(valid.message or "refused by the operator")
        if spec is not None and valid is not None and valid.status == "False"
        else None,
        waiting_for_room=_message(
            conditions, ConditionType.WAITING_FOR_ROOM, "waiting for room on its GPU pool"
        ),
        # Of the spec it was computed from: a selector changed since may match pods.
        no_pods=ready is not None
        and (ready.status, ready.reason) == ("False", ConditionReason.NO_PODS)
        and isinstance(generation, int)
        and ready.observed_generation == generation,
    )


def _true(conditions: Mapping[str, Condition], kind: str) -> Condition | None:
    """The condition `kind` while it is True, else None."""
    condition = conditions.get(kind)
    return condition if condition is not None and condition.status == "True" else None


def _message(conditions: Mapping[str, Condition], kind: str, otherwise: str) -> str | None:
    """The message of the condition `kind` while it is True (`otherwise` if it has none)."""
    condition = _true(conditions, kind)
    return None if condition is None else (condition.message or otherwise)


def _seconds(moment: datetime | None) -> float | None:
    return None if moment is None else seconds_of(moment)
