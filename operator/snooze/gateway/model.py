"""One InferenceModel as the gateway reads it: its spec, and what the operator reported.

The gateway trusts a model's status (the operator alone may write it) and never a label or
annotation that a pod's owner could set alone: the name a model is routed by, the pods it may
be routed to and a known wake failure all come from the status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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
from snooze.api.times import parse_time
from snooze.kube.pods import PodInfo

Key = tuple[str, str]


@dataclass(frozen=True, kw_only=True)
class StatusPod:
    """A pod as the operator last reported it in `status.pods`."""

    state: str
    uid: str | None = None
    """The pod's metadata.uid, when the operator wrote it: a recreated pod of the same name
    is then not mistaken for the one the operator saw."""
    failure_reason: str = ""
    last_failure: float | None = None

    def vouches_for(self, pod: PodInfo) -> bool:
        return self.uid is None or self.uid == pod.uid


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
    status_pods: Mapping[str, StatusPod] = field(default_factory=dict)
    wake_failure: WakeFailure | None = None
    operator_refusal: str | None = None
    """The message of a SpecValid condition the operator set False: something only it can
    check (such as a scaleTargetRef the model does not own) keeps it from acting."""
    waiting_for_room: str | None = None
    """The message of a WaitingForRoom condition that is True: its wake waits for its GPU
    pool to make room."""

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
        return entry is not None and entry.state == EngineState.AWAKE and entry.vouches_for(pod)

    def failed_pod(self, pod: PodInfo) -> StatusPod | None:
        """The status entry of a pod whose wake failed (label or status `failed`), else None."""
        entry = self.status_pods.get(pod.name)
        if entry is not None and not entry.vouches_for(pod):
            entry = None
        failed = pod.state is EngineState.FAILED or (
            entry is not None and entry.state == EngineState.FAILED
        )
        if not failed:
            return None
        return entry or StatusPod(state=EngineState.FAILED)

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
    """Read an InferenceModel manifest; an invalid spec is kept (listed, refused), never raised."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    raw_spec = body.get("spec") or {}
    spec: InferenceModelSpec | None
    try:
        spec, error = parse_spec(raw_spec), ""
    except SpecError as exc:
        spec, error = None, str(exc)
    name = str(meta.get("name", ""))
    model_name = (spec.model_name if spec else raw_spec.get("modelName")) or name
    annotations = meta.get("annotations") or {}
    last_wake = status.get("lastWakeSeconds")
    conditions = {
        str(c.get("type")): c for c in status.get("conditions") or [] if isinstance(c, dict)
    }
    conflict = conditions.get(ConditionType.CONFLICT, {})
    failed = conditions.get(ConditionType.WAKE_FAILED, {})
    valid = conditions.get(ConditionType.SPEC_VALID, {})
    room = conditions.get(ConditionType.WAITING_FOR_ROOM, {})
    claimed = status.get("modelName")
    return Model(
        namespace=str(meta.get("namespace", "")),
        name=name,
        model_name=str(model_name),
        spec=spec,
        spec_error=error,
        wake_requested_at=parse_time(annotations.get(WAKE_REQUESTED_ANNOTATION)),
        phase=str(status.get("phase") or ("Invalid" if spec is None else "Pending")),
        last_wake_seconds=float(last_wake) if isinstance(last_wake, int | float) else None,
        scaled_to_zero_at=parse_time(status.get("scaledToZeroTime")),
        claimed_name=str(claimed) if isinstance(claimed, str) and claimed else None,
        conflict=str(conflict.get("message") or "the model name is taken")
        if conflict.get("status") == "True"
        else None,
        status_pods=_status_pods(status.get("pods")),
        wake_failure=WakeFailure(
            reason=str(failed.get("reason") or ConditionReason.WAKE_FAILED),
            message=str(failed.get("message") or ""),
            since=parse_time(failed.get("lastTransitionTime")),
        )
        if failed.get("status") == "True"
        else None,
        # Only for a spec the gateway itself reads as valid: the operator's own reasons.
        operator_refusal=str(valid.get("message") or "refused by the operator")
        if spec is not None and valid.get("status") == "False"
        else None,
        waiting_for_room=str(room.get("message") or "waiting for room on its GPU pool")
        if room.get("status") == "True"
        else None,
    )


def _status_pods(entries: Any) -> dict[str, StatusPod]:
    pods: dict[str, StatusPod] = {}
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not entry.get("name"):
            continue
        uid = entry.get("uid")
        pods[str(entry["name"])] = StatusPod(
            state=str(entry.get("state", "")),
            uid=str(uid) if uid else None,
            failure_reason=str(entry.get("failureReason") or ""),
            last_failure=parse_time(entry.get("lastFailureTime")),
        )
    return pods
