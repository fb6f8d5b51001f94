"""The InferenceModel resource as pydantic models: the one source of the CRD and of validation."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from snooze.api.durations import DURATION_PATTERN, parse_duration
from snooze.api.keepawake import (
    AutoIdleSpec,
    PrewakeSpec,
    Schedule,
)
from snooze.api.quantities import QUANTITY_PATTERN, parse_quantity

GROUP = "snooze.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceModel"
PLURAL = "inferencemodels"
SINGULAR = "inferencemodel"
SHORT_NAMES = ["im"]


def _positive_duration(text: str) -> str:
    if parse_duration(text) <= 0:
        raise ValueError(f"{text!r} must be longer than zero, such as '30s' or '10m'")
    return text


Duration = Annotated[
    str,
    Field(
        pattern=DURATION_PATTERN,
        max_length=32,
        json_schema_extra={"example": "10m"},
    ),
    AfterValidator(_positive_duration),
]


NEVER = "Never"
AUTO = "Auto"
IDLE_PATTERN = f"^({NEVER}|{AUTO}|{DURATION_PATTERN[1:-1]})$"


def _positive_or_never(text: str) -> str:
    return text if text in (NEVER, AUTO) else _positive_duration(text)


IdleDuration = Annotated[
    str,
    Field(pattern=IDLE_PATTERN, max_length=32, json_schema_extra={"example": "10m"}),
    AfterValidator(_positive_or_never),
]
"""A duration, `Never` or `Auto`."""


class Wire(BaseModel):
    """camelCase on the wire, unknown fields refused, so that a typo is an error and not a no-op."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(Wire):
    """One requirement of a label selector, as in Kubernetes' own LabelSelector."""

    key: str = Field(min_length=1)
    """The label key that the requirement applies to."""
    operator: SelectorOperator
    """How the key relates to the values: In, NotIn, Exists or DoesNotExist."""
    values: list[str] = Field(default_factory=list)
    """The values for In and NotIn (at least one); empty for Exists and DoesNotExist."""

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        needs_values = self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)
        if needs_values and not self.values:
            raise ValueError(f"operator {self.operator.value} needs at least one value")
        if not needs_values and self.values:
            raise ValueError(f"operator {self.operator.value} takes no values")
        return self


class LabelSelector(Wire):
    """Which pods serve the model: at least one of matchLabels or matchExpressions."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    """Labels that a pod must carry, each with this exact value."""
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)
    """Further requirements on a pod's labels; all must hold."""

    @model_validator(mode="after")
    def _not_empty(self) -> LabelSelector:
        # An empty selector would match every pod in the namespace: never what is meant.
        if not self.match_labels and not self.match_expressions:
            raise ValueError(
                "an empty selector would match every pod in the namespace: "
                "give matchLabels or matchExpressions"
            )
        return self

    def to_label_selector(self) -> str:
        """The selector as the API's `labelSelector` query string."""
        parts = [f"{key}={value}" for key, value in sorted(self.match_labels.items())]
        for req in self.match_expressions:
            if req.operator is SelectorOperator.IN:
                parts.append(f"{req.key} in ({','.join(req.values)})")
            elif req.operator is SelectorOperator.NOT_IN:
                parts.append(f"{req.key} notin ({','.join(req.values)})")
            elif req.operator is SelectorOperator.EXISTS:
                parts.append(req.key)
            else:
                parts.append(f"!{req.key}")
        return ",".join(parts)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a pod with `labels` is selected."""
        if any(labels.get(key) != value for key, value in self.match_labels.items()):
            return False
        for req in self.match_expressions:
            present = req.key in labels
            if req.operator is SelectorOperator.IN and labels.get(req.key) not in req.values:
                return False
            if (
                req.operator is SelectorOperator.NOT_IN
                and present
                and labels[req.key] in req.values
            ):
                return False
            if req.operator is SelectorOperator.EXISTS and not present:
                return False
            if req.operator is SelectorOperator.DOES_NOT_EXIST and present:
                return False
        return True


class ScaleTargetRef(Wire):
    """The workload that owns the model's pods, scaled through its scale subresource."""

    api_version: str = "apps/v1"
    """API version of the workload."""
    kind: Literal["Deployment", "StatefulSet"]
    """Kind of the workload: Deployment or StatefulSet."""
    name: str = Field(min_length=1)
    """Name of the workload, in the InferenceModel's namespace."""


class EngineSpec(Wire):
    """Which engine each pod runs, and how to reach it."""

    kind: Literal["vllm", "sglang"] = "vllm"
    """vllm (`vllm serve` with --enable-sleep-mode) or sglang (`sglang.launch_server` with
    --enable-memory-saver): how its engines are put to sleep, woken and probed."""
    port: int = Field(default=8000, ge=1, le=65535)
    """The engine's HTTP port on the pod (vLLM serves on 8000 by default, SGLang on 30000: set
    it)."""
    scheme: Literal["http", "https"] = "http"
    """http or https."""


class IdleSpec(Wire):
    """When an engine counts as idle."""

    after: IdleDuration = "10m"
    """How long an engine must see no request before it is put to sleep, such as 30s, 10m, 2h;
    Never: it sleeps only when its GPU pool needs the room, or by desiredState; Auto: the
    operator chooses it from the model's own idle gaps, within idle.auto."""
    auto: AutoIdleSpec = Field(default_factory=AutoIdleSpec)
    """The bounds of the keep-alive that after: Auto chooses."""


class SleepSpec(Wire):
    """How deeply an idle engine sleeps."""

    level: Literal[1, 2] = 1
    """1: weights move to host RAM, fast wake (SGLang: needs --enable-weights-cpu-backup). 2:
    weights are discarded and reloaded on wake."""


class WakeSpec(Wire):
    """How a sleeping engine is woken, and what happens when waking fails."""

    on_request: bool = True
    """Wake the model when a request for it arrives (through the gateway's wake annotation)."""
    timeout: Duration = "2m"
    """How long one wake may take before it counts as failed; the gateway holds requests as long."""
    on_failure: Literal["Restart", "Report"] = "Restart"
    """Restart (the default): delete the pod after failureThreshold failed wakes so that its
    controller recreates it. Report: only report the failure on status, in Events and metrics,
    and leave the engine unrouted until someone restarts it."""
    failure_threshold: int = Field(default=2, ge=1, le=100)
    """Failed wakes in a row before onFailure applies. A wake that hit the hybrid KV-cache
    crash, or whose engine answered differently than before it slept, is never retried: only
    a restart recovers the engine."""
    verify: bool = True
    """Check each woken engine before it is published awake: before an engine's first sleep
    the operator records its answer to a fixed greedy request, and after each wake it asks
    again; a different answer is a failed wake (OutputMismatch) and the engine is never routed
    to. Where the engine serves /weight_checker (vLLM 0.32+) its weights are checksummed too,
    and compared after level-2 wakes. false: publish woken engines unchecked."""
    on_known_bug: Literal["FallBack", "NeverSleep", "SleepAnyway"] = "FallBack"
    """What to do with an engine whose vLLM release and configuration (LoRA, tensor or
    pipeline parallel, sleep level) are known to break sleep or wake (the KnownBug condition
    names the vLLM issue). FallBack (the default): sleep at the other level when it is not
    known to break, else stay awake; and never send /sleep while requests are in flight where
    that crashes the engine. NeverSleep: keep such an engine awake. SleepAnyway: sleep as the
    spec says, and only report it."""
    cold_start_timeout: Duration = "10m"
    """How long a scale-up from zero may take until an engine answers (scheduling, image pull,
    model load); the gateway holds requests as long."""


class DesiredState(StrEnum):
    AUTO = "Auto"
    AWAKE = "Awake"
    ASLEEP = "Asleep"


def _positive_quantity(text: str) -> str:
    if parse_quantity(text) <= 0:
        raise ValueError(f"{text!r} must be more than zero, such as '30Gi'")
    return text


Quantity = Annotated[
    str,
    Field(pattern=QUANTITY_PATTERN, max_length=32, json_schema_extra={"example": "30Gi"}),
    AfterValidator(_positive_quantity),
]
"""A Kubernetes memory quantity: `80Gi`, `512Mi`, `40G`."""

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class ModelPoolSpec(Wire):
    """The GPU pool the model's engines share a device in, and what each engine takes there."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    """A GPUPool in the InferenceModel's namespace."""
    memory: Quantity | None = None
    """One engine's awake footprint on the device (weights, KV cache, CUDA context). Default:
    the engine's own share, read from its vllm:cache_config_info metric
    (gpu_memory_utilization) times the pool's memory."""
    asleep_memory: Quantity = "1Gi"
    """What a sleeping engine still holds on the device (CUDA context, graphs: vLLM's sleep frees
    only the weights and the KV cache). Measure it; do not assume zero."""
    weights_memory: Quantity | None = None
    """Host RAM one engine's level-1 sleep pins (its weights, copied out of the GPU, each block
    rounded up to a power of two by PyTorch), counted against the pool's hostMemory from its
    first level-1 sleep until its container restarts: the copy is kept after the wake.
    Default: memory minus asleepMemory."""
    priority: int = Field(default=0, ge=-1000, le=1000)
    """When room must be made, lower priorities are put to sleep first."""

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory is None else parse_quantity(self.memory)

    @property
    def asleep_bytes(self) -> int:
        return parse_quantity(self.asleep_memory)

    @property
    def weights_bytes(self) -> int | None:
        return None if self.weights_memory is None else parse_quantity(self.weights_memory)


class InferenceModelSpec(Wire):
    """Which pods serve a model, when they sleep and how they wake."""

    model_name: str | None = Field(default=None, min_length=1, max_length=253)
    """The name clients send in a request's `model` field; defaults to metadata.name."""
    selector: LabelSelector
    """Selects the pods that serve this model, in the InferenceModel's namespace."""
    scale_target_ref: ScaleTargetRef | None = None
    """Optional: the Deployment or StatefulSet that owns the pods."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """How to reach the engines."""
    idle: IdleSpec = Field(default_factory=IdleSpec)
    """When an engine counts as idle."""
    sleep: SleepSpec = Field(default_factory=SleepSpec)
    """How deeply idle engines sleep."""
    wake: WakeSpec = Field(default_factory=WakeSpec)
    """How engines are woken."""
    min_awake: int = Field(default=0, ge=0, le=10000)
    """Engines kept awake whatever the traffic."""
    desired_state: DesiredState = DesiredState.AUTO
    """Auto: sleep when idle, wake on request. Awake or Asleep: a manual override."""
    pool: ModelPoolSpec | None = None
    """Optional: the GPUPool whose device the engines share with other models' engines; the
    pool then decides when one may wake (making room first) and which sleeps for another."""
    scale_to_zero_after: Duration | None = None
    """Optional: idle this long (longer than idle.after), the scaleTargetRef workload is scaled
    to zero replicas, freeing host RAM and the GPU reservation too; a request scales it back
    to the replicas it had. Never while minAwake > 0."""
    schedule: Schedule = Field(default_factory=list)
    """Keep-awake windows: at each window's start the engines are woken (scaled up from zero
    if needed) before any request, and during it at least its minAwake stay awake."""
    prewake: PrewakeSpec | None = None
    """Optional: wake a sleeping model lead before the requests its own traffic makes likely
    (a weekly profile, learnt by the operator and kept on status.prewake)."""

    @field_validator("scale_to_zero_after")
    @classmethod
    def _tiers_in_order(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        if info.data.get("scale_target_ref") is None:
            raise ValueError(
                "scaleToZeroAfter needs scaleTargetRef: name the Deployment or StatefulSet to scale"
            )
        idle = info.data.get("idle")
        if idle is not None and idle.after == NEVER:
            raise ValueError(
                "scaleToZeroAfter needs idle.after to be a duration, not Never: engines sleep "
                "first, then scale to zero"
            )
        longest = idle.auto.max if idle is not None and idle.after == AUTO else None
        if idle is not None and longest is not None:
            if parse_duration(value) <= parse_duration(longest):
                raise ValueError(
                    f"scaleToZeroAfter ({value}) must be longer than idle.auto.max ({longest}): "
                    "engines sleep first, then scale to zero"
                )
        elif idle is not None and parse_duration(value) <= parse_duration(idle.after):
            raise ValueError(
                f"scaleToZeroAfter ({value}) must be longer than idle.after ({idle.after}): "
                "engines sleep first, then scale to zero"
            )
        return value

    @property
    def scale_to_zero_after_seconds(self) -> float | None:
        return (
            None if self.scale_to_zero_after is None else parse_duration(self.scale_to_zero_after)
        )

    @property
    def cold_start_timeout_seconds(self) -> float:
        return parse_duration(self.wake.cold_start_timeout)

    @property
    def idle_after_seconds(self) -> float:
        """Seconds of idleness before sleep; infinite for Never; for Auto, idle.auto.max (the
        operator passes the spec with the keep-alive it chose in its place)."""
        if self.idle.after == NEVER:
            return math.inf
        if self.idle.after == AUTO:
            return self.idle.auto.max_seconds
        return parse_duration(self.idle.after)

    @property
    def wake_timeout_seconds(self) -> float:
        return parse_duration(self.wake.timeout)


class SpecError(ValueError):
    """A spec the operator cannot act on; the message names each field and says what to fix."""


def parse_spec(raw: dict[str, Any]) -> InferenceModelSpec:
    """Validate a spec from the API; raise SpecError naming each bad field."""
    try:
        return InferenceModelSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(describe_validation_error(exc, prefix="spec")) from None


class SpecMemo:
    """One model's spec, validated again only when it changes: most of a model's watch events
    are its own status writes, and validating at each of them and at each cycle was 9% of the
    operator's CPU while 10,000 models started."""

    def __init__(self) -> None:
        self._raw: dict[str, Any] | None = None
        self._result: InferenceModelSpec | SpecError = SpecError("spec not validated yet")

    def validate(self, raw: dict[str, Any]) -> InferenceModelSpec | SpecError:
        """`raw` validated, or the SpecError that says why it is not valid."""
        if self._raw is None or raw != self._raw:
            try:
                self._result = parse_spec(raw)
            except SpecError as exc:
                self._result = exc
            self._raw = copy.deepcopy(raw)  # raw's nested parts belong to the caller
        return self._result


def describe_validation_error(exc: ValidationError, *, prefix: str) -> str:
    """One line per problem, each starting with the field's dotted path on the wire."""
    lines = []
    for error in exc.errors():
        path = ".".join([prefix, *(str(part) for part in error["loc"])])
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field: remove it or check its spelling"
        lines.append(f"{path}: {message}")
    return "; ".join(lines)


# ---------------------------------------------------------------------------------------------
# The states the operator reports (the status's types are in modelstatus.py).


class Phase(StrEnum):
    PENDING = "Pending"
    AWAKE = "Awake"
    ASLEEP = "Asleep"
    WAKING = "Waking"
    DRAINING = "Draining"
    DEGRADED = "Degraded"
    SCALED_TO_ZERO = "ScaledToZero"
    SCALING_UP = "ScalingUp"
    INVALID = "Invalid"


class EngineState(StrEnum):
    """The values of the `snooze.dev/state` pod label: the published routing view."""

    AWAKE = "awake"
    DRAINING = "draining"
    ASLEEP = "asleep"
    WAKING = "waking"
    FAILED = "failed"
