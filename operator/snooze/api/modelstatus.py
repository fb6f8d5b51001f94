"""The status of an InferenceModel and the condition shape GPUPools share: written by the
operator only, lenient on read (extra fields ignored) so that an operator of a newer release
never chokes on what an older one wrote, and the other way round."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from snooze.api.keepawake import PrewakeStatus, WindowStatus
from snooze.api.models import Phase
from snooze.api.times import Time


class Status(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        use_attribute_docstrings=True,
    )


S = TypeVar("S", bound=Status)
# A status with this many separate faults is not worth saving a part of.
_MOST_FAULTS = 64


# metav1.Condition's bounds (k8s.io/apimachinery/pkg/apis/meta/v1/types.go): a qualified name
# for the type, a CamelCase reason.
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class Condition(Status):
    """A condition with the fields, formats and bounds of Kubernetes' metav1.Condition."""

    type: str = Field(max_length=316, pattern=CONDITION_TYPE_PATTERN)
    """Ready (the model can serve: an engine is awake, or a request can wake one), Awake (an
    engine is awake now), Asleep (every ready engine sleeps), WakeFailed, SleepFailed,
    SpecValid, Conflict (another model holds this one's model name), SharedPods (another model
    selects some of its pods), WaitingForRoom (a wake waits for its GPU pool to make room),
    WakeVerified (woken engines are checked before they serve), KnownBug (an engine's vLLM
    release and arguments are known to break sleep or wake) or PickerReadable (the endpoint
    picker of an InferencePool serving it can be read); on a GPUPool, SpecValid,
    Overcommitted, ClaimConflict and MemoryNotFreed."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    observed_generation: int | None = Field(
        default=None, ge=0, json_schema_extra={"format": "int64"}
    )
    """The metadata.generation this condition was computed from."""
    last_transition_time: Time
    """When status last changed."""
    reason: str = Field(min_length=1, max_length=1024, pattern=CONDITION_REASON_PATTERN)
    """A CamelCase word for programs."""
    message: str = Field(max_length=32768)
    """What happened and what to do, for people; may be empty."""


class OutputRecord(Status):
    """An engine's answer to the fixed greedy request, recorded before its first sleep."""

    route: str = Field(max_length=64)
    """The route that answered: /v1/completions, or /v1/chat/completions for a model without it."""
    tokens: list[int] | None = Field(default=None, max_length=64)
    """The generated token ids (vLLM 0.10.2+ returns them)."""
    text_sha256: str = Field(max_length=64)
    """SHA-256 of the generated text: compared where token ids are missing."""


class PodVerification(Status):
    """What an engine's wakes are checked against, and where each check stands
    (docs/wake-verification.md). Written by the operator only, so that a pod's owner cannot
    forge it; it speaks of one run of the engine (the pod's uid and its container's restarts)."""

    restarts: int | None = None
    """The restart count of the engine's container these records are of."""
    output: str = "Pending"
    """Off, Pending (recorded at its first sleep), Recorded, Verified, Mismatch,
    NotDeterministic (its greedy answer varies: not checked), Unsupported (it does not
    generate text), Unavailable (it could not be asked) or Missed (it slept unrecorded)."""
    weights: str = "Pending"
    """Off, Pending, Recorded, Verified, Mismatch, Unsupported (no /weight_checker: vLLM
    before 0.32.0) or Unavailable."""
    baseline: OutputRecord | None = None
    """Its greedy answer before its first sleep."""
    weights_digest: str | None = Field(default=None, max_length=64)
    """SHA-256 over every weight tensor's name and digest, before its first sleep."""
    weight_tensors: int | None = None
    """How many weight tensors (over all ranks) that digest covers."""
    message: str = ""
    """Why a check does not apply, when it does not."""


class PodState(StrEnum):
    """A pod entry's `state` where it is no `snooze.dev/state` label's value (EngineState): why
    the operator vouches for no state of its engine."""

    SHARED = "shared"
    UNREADY = "unready"
    UNREACHABLE = "unreachable"
    UNKNOWN = "unknown"


class PodStatus(Status):
    """One engine, as the operator last saw it."""

    name: str
    """The pod's name."""
    uid: str = ""
    """The pod's uid: this entry speaks of that pod only, not of one recreated under its name."""
    state: str
    """awake, draining, asleep, waking, failed, unready, unknown, unreachable, or shared
    (selected by another InferenceModel too: acted on by neither)."""
    since: Time | None = None
    """When the pod entered this state."""
    last_activity_time: Time | None = None
    """When the engine last had a request running or waiting, or finished one."""
    wake_failures: int = 0
    """Failed wakes in a row."""
    failure_reason: str = ""
    """Why the last wake failed: HybridKVCacheReinit, Timeout, Unreachable, EngineError,
    OutOfMemory, OutputMismatch (it woke answering differently) or WeightsMismatch."""
    last_failure_time: Time | None = None
    """When the last wake failed."""
    sleep_failures: int = 0
    """Failed sleeps in a row."""
    sleep_failure_reason: str = ""
    """Why the last sleep failed: SleepModeDisabled (the engine runs without sleep mode:
    Snooze keeps it awake until the pod or the spec changes), KnownBug (a drain timed out where
    a /sleep with requests in flight would crash the engine), Timeout, Unreachable or
    EngineError."""
    message: str = ""
    """Why the pod is in this state, when that is worth saying."""
    verification: PodVerification | None = None
    """What its wakes are checked against (spec.wake.verify)."""


class InferenceModelStatus(Status):
    """What the operator last saw and did; the summary for people and dashboards."""

    phase: Phase = Phase.PENDING
    """Pending, Awake, Asleep, Waking, Draining, Degraded, ScaledToZero, ScalingUp or Invalid."""
    model_name: str = ""
    """The model name that the gateway routes by (empty while the spec is invalid); the model
    holds it unless its Conflict condition is True."""
    engines: int = 0
    """Pods selected."""
    awake: int = 0
    """Engines awake and serving."""
    asleep: int = 0
    """Engines asleep."""
    waking: int = 0
    """Engines being woken."""
    draining: int = 0
    """Engines draining before sleep."""
    pods: list[PodStatus] = Field(default_factory=list)
    """Per-pod state."""
    last_activity_time: Time | None = None
    """The latest activity seen on any engine."""
    activity_written_time: Time | None = None
    """When the activity times here were last brought up to date: a busy model's are written
    at most once per the operator's status interval, so later activity may be that much newer
    (a restarted operator counts it so, and never sleeps an engine on older news)."""
    last_sleep_time: Time | None = None
    """When an engine last went to sleep."""
    last_wake_time: Time | None = None
    """When an engine last finished waking."""
    last_wake_seconds: float | None = None
    """How long the last wake took, in seconds."""
    replicas: int | None = None
    """The scaleTargetRef workload's replicas, as last seen."""
    scaled_from_replicas: int | None = None
    """The replicas the workload had before Snooze scaled it to zero; restored on wake."""
    scaled_to_zero_time: Time | None = None
    """When Snooze scaled the workload to zero."""
    scale_up_time: Time | None = None
    """When Snooze scaled the workload back up, until an engine answers."""
    manual_scale_time: Time | None = None
    """When someone else scaled the workload while Snooze had it at zero, or scaled it to zero
    themselves: Snooze leaves the scale alone until the model is next active."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready, Awake, Asleep, WakeFailed, SleepFailed, SpecValid, Conflict, SharedPods,
    WaitingForRoom, WakeVerified and KnownBug."""
    observed_generation: int | None = None
    """The metadata.generation the operator last acted on."""
    active_window: WindowStatus | None = None
    """The keep-awake window in force now, if any."""
    next_window: WindowStatus | None = None
    """The next keep-awake window to start."""
    prewake: PrewakeStatus | None = None
    """What the operator learnt of the model's traffic for pre-wake and idle.after: Auto."""


def parse_status(raw: object) -> InferenceModelStatus:
    """An InferenceModel's status as the API holds it: the one way the operator reads it."""
    return parse_leniently(InferenceModelStatus, raw)


def parse_leniently(kind: type[S], raw: object) -> S:
    """A status read leniently: what cannot be read (a field of the wrong type, a list entry
    missing what it needs) is dropped, the rest kept. An operator restarted on a status that
    an older or newer release wrote, or that someone with rights on it changed, starts from
    what it can trust, never from nothing, and never fails on it."""
    data = _plain(raw) if isinstance(raw, Mapping) else {}
    for _ in range(_MOST_FAULTS):
        try:
            return kind.model_validate(data)
        except ValidationError as exc:
            for error in exc.errors():
                _drop(data, error["loc"], missing=error["type"] == "missing")
            _compact(data)
    return kind()


def merge_patch(status: Status) -> dict[str, Any]:
    """The status to write as a JSON merge patch: the fields that were set (a None as null,
    which removes what the API holds), and in lists, whose items a merge patch replaces whole,
    no null (the API server would keep it)."""
    return {
        key: _without_nulls(value) if isinstance(value, list) else value
        for key, value in status.model_dump(mode="json", by_alias=True, exclude_unset=True).items()
    }


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    """A copy made of dicts and lists (kopf's views of a body are neither)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _drop(data: Any, loc: tuple[int | str, ...], *, missing: bool) -> None:
    """Remove what `loc` points at, as deep as it leads: a field, or a list entry (marked
    None, so that the places of the other faults hold until _compact); for a missing field,
    the object that lacks it (no top-level field is required)."""
    path = loc[:-1] if missing else loc
    container: Any = None
    step: int | str = ""
    at = data
    for part in path:
        if not _holds(at, part):
            break  # the rest names no place in the data (a type's tag, say)
        container, step, at = at, part, at[part]
    if isinstance(container, dict):
        container.pop(step, None)
    elif isinstance(container, list) and isinstance(step, int):
        container[step] = None


def _holds(value: Any, part: int | str) -> bool:
    if isinstance(value, dict):
        return part in value
    return isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value)


def _compact(value: Any) -> None:
    """Drop the list entries that _drop marked."""
    if isinstance(value, dict):
        for item in value.values():
            _compact(item)
    elif isinstance(value, list):
        value[:] = [item for item in value if item is not None]
        for item in value:
            _compact(item)
