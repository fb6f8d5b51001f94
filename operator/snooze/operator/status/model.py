"""Build an InferenceModel's status from what the operator saw: pure, so it is tested as data."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from snooze.api.conditions import ConditionReason, ConditionType
from snooze.api.models import EngineState, Phase
from snooze.api.modelstatus import InferenceModelStatus, PodStatus
from snooze.api.times import moment
from snooze.kube.pods import PodInfo
from snooze.operator.memory import EngineMemory, ModelMemory

# Re-exported: the GPU pools' status (pool/status.py) builds its conditions from here too.
from snooze.operator.status.conditions import ConditionValue as ConditionValue
from snooze.operator.status.conditions import conditions as conditions
from snooze.operator.status.integrity import known_bug, verification_entry, wake_verified
from snooze.policy.sleep import phase

EngineMemoryView = tuple[str, EngineMemory]

# A busy engine's activity time moves at every probe; writing each move would make the
# operator's API writes grow with traffic. Status records it at this granularity, which
# bounds what a restarted operator can misjudge (it may sleep an engine this much early).
ACTIVITY_GRANULARITY_SECONDS = 30.0


@dataclass(frozen=True, kw_only=True)
class Conflicts:
    """What other models contest: this model's name, and pods they select too."""

    model_name: str = ""
    name_taken: bool = False
    """Another model holds `model_name` (it claimed it first): the gateway routes it there."""
    shared: dict[str, list[str]] = field(default_factory=dict)
    """Pods that other models of the namespace also select: pod -> those models."""

    @property
    def name_message(self) -> str:
        if not self.name_taken:
            return ""
        return (
            f"model name {self.model_name!r} is already served by another InferenceModel, "
            "which claimed it first; the gateway does not route it to this one. Choose another "
            "spec.modelName (a cluster admin sees who holds which with "
            "`kubectl get inferencemodels.snooze.dev -A`)"
        )

    @property
    def shared_message(self) -> str:
        if not self.shared:
            return ""
        parts = [f"{pod} (also selected by {', '.join(by)})" for pod, by in self.shared.items()]
        return (
            f"pods selected by other InferenceModels too: {'; '.join(sorted(parts))}. Snooze "
            "sleeps, wakes and routes such a pod for none of them: make the selectors disjoint"
        )


def _time(seconds: float | None) -> datetime | None:
    return None if seconds is None else moment(seconds)


def _coarse(seconds: float) -> float:
    return seconds - seconds % ACTIVITY_GRANULARITY_SECONDS


def pod_state(pod: PodInfo) -> str:
    if not pod.ready:
        return "unready"
    state = pod.state
    return state.value if state is not None else "unknown"


def operator_view(memory: ModelMemory, pod: PodInfo) -> EngineState | None:
    """The state the operator itself vouches for: the label it last wrote on the pod, or, when
    the label says awake, what the engine last said.

    Not the pod's label as it stands: anyone with rights on the pod can write that, and the
    gateway routes only to pods this status lists awake. (Also ahead of the pod index, which
    may show a label the operator has just replaced.)
    """
    engine = memory.engines.get(pod.name)
    label = pod.state
    if engine is None:
        return label
    if engine.published is not None:
        label = engine.published
    if label is EngineState.AWAKE and engine.sleeping:
        return EngineState.ASLEEP  # the engine said it sleeps: a label saying awake lies
    return label


def build(
    *,
    model_name: str,
    pods: Sequence[PodInfo],
    memory: ModelMemory,
    previous: InferenceModelStatus,
    generation: int | None,
    now: float,
    spec_error: str | None = None,
    replicas: int | None = None,
    conflicts: Conflicts | None = None,
    waiting_for_room: str | None = None,
    selector: str = "",
    namespace: str = "",
    can_wake: bool = True,
    verify: bool = True,
    picker: ConditionValue | None = None,
) -> InferenceModelStatus:
    """The whole status to write; `pods` are all the pods selected, shared ones included.
    `selector` and `namespace` (the spec's, as a label selector string) explain a model that
    selects no pod; `can_wake` says whether a request may wake it (wake.onRequest, and no
    desiredState: Asleep); `verify` is spec.wake.verify; `picker`: whether the endpoint
    pickers of a model behind InferencePools can be read (operator/traffic/pickerwake.py)."""
    conflicts = conflicts or Conflicts()
    shared = conflicts.shared
    every = pods
    pods = [p for p in every if p.name not in shared]
    ready = [p for p in pods if p.ready]
    # An engine that stopped answering serves nothing, whatever its label says.
    labels = [None if _unreachable(memory, p) else operator_view(memory, p) for p in ready]
    count = {state: sum(1 for label in labels if label is state) for state in EngineState}
    model_phase = phase(labels, ready=len(ready), spec_valid=spec_error is None)
    if spec_error is None and not count[EngineState.AWAKE]:
        if memory.scaled_from is not None:
            model_phase = Phase.SCALED_TO_ZERO
        elif memory.scale_up_time is not None:
            model_phase = Phase.SCALING_UP

    pod_entries = []
    failing: list[tuple[str, str, str]] = []
    unable_to_sleep: list[EngineMemoryView] = []
    for pod in sorted(every, key=lambda p: p.name):
        engine = memory.engines.get(pod.name)
        view = operator_view(memory, pod)
        state = "shared" if pod.name in shared else pod_state(pod)
        if state not in ("shared", "unready") and view is not None:
            state = view.value
        if _unreachable(memory, pod):
            state = "unreachable"  # whatever its label says: not to be routed to
        entry = PodStatus(name=pod.name, state=state)
        if pod.uid:
            # So that a reader (the gateway) never trusts this entry for a pod recreated
            # under the same name.
            entry.uid = pod.uid
        if pod.name in shared:
            entry.message = f"also selected by {', '.join(shared[pod.name])}"
        elif engine is not None:
            _engine_fields(entry, engine, state)
            entry.verification = verification_entry(engine, verify=verify)
            if engine.sleep_failures:
                unable_to_sleep.append((pod.name, engine))
            if engine.wake_failures:
                failing.append((pod.name, engine.last_failure_reason, engine.last_failure_message))
        pod_entries.append(entry)

    awake, asleep = count[EngineState.AWAKE], count[EngineState.ASLEEP]
    engines = [(p.name, memory.engines[p.name]) for p in ready if p.name in memory.engines]
    values = [
        ConditionValue(
            type=ConditionType.SPEC_VALID,
            status=spec_error is None,
            reason=ConditionReason.VALID if spec_error is None else ConditionReason.INVALID_SPEC,
            message=""
            if spec_error is None
            else f"{spec_error}. Fix the spec: nothing is slept or woken until then.",
        ),
        _ready(
            Serving(
                count=count,
                ready=len(ready),
                selected=len(pods),
                unreachable=sum(1 for p in ready if _unreachable(memory, p)),
                spec_error=spec_error,
                name_taken=conflicts.name_taken,
                can_wake=can_wake,
                scaled_to_zero=memory.scaled_from is not None,
                scaling_up=memory.scale_up_time is not None,
            ),
            selector=selector,
            namespace=namespace,
        ),
        ConditionValue(
            type=ConditionType.AWAKE,
            status=awake > 0,
            reason=ConditionReason.ENGINES_AWAKE if awake else ConditionReason.NO_ENGINE_AWAKE,
            message=f"{awake} of {len(ready)} ready engines awake",
        ),
        ConditionValue(
            type=ConditionType.ASLEEP,
            status=bool(ready) and asleep == len(ready),
            reason=ConditionReason.ALL_ASLEEP
            if ready and asleep == len(ready)
            else ConditionReason.NOT_ALL_ASLEEP,
            message=f"{asleep} of {len(ready)} ready engines asleep",
        ),
        _wake_failed(failing or ([memory.failure] if memory.failure else [])),
        _sleep_failed(unable_to_sleep),
        ConditionValue(
            type=ConditionType.CONFLICT,
            status=conflicts.name_taken,
            reason=ConditionReason.MODEL_NAME_TAKEN
            if conflicts.name_taken
            else (ConditionReason.NAME_HELD if model_name else ConditionReason.NO_MODEL_NAME),
            message=conflicts.name_message
            or (
                f"model name {model_name!r} is this model's"
                if model_name
                else "an invalid spec claims no model name"
            ),
        ),
        ConditionValue(
            type=ConditionType.WAITING_FOR_ROOM,
            status=waiting_for_room is not None,
            reason=ConditionReason.POOL_FULL if waiting_for_room else ConditionReason.NOT_WAITING,
            message=waiting_for_room or "no wake waits for room on a GPU pool",
        ),
        ConditionValue(
            type=ConditionType.SHARED_PODS,
            status=bool(shared),
            reason=ConditionReason.PODS_SHARED if shared else ConditionReason.NO_SHARED_PODS,
            message=conflicts.shared_message or "no pod is selected by another model",
        ),
        wake_verified(engines, verify=verify),
        known_bug(engines),
        *([picker] if picker is not None else []),
    ]
    return InferenceModelStatus(
        phase=model_phase,
        model_name=model_name,
        engines=len(every),
        awake=awake,
        asleep=asleep + count[EngineState.FAILED],
        waking=count[EngineState.WAKING],
        draining=count[EngineState.DRAINING],
        pods=pod_entries,
        last_activity_time=_time(
            None if memory.last_activity is None else _coarse(memory.last_activity)
        ),
        # Set when the status is written (operator/model/reporter.py): the activity times are then
        # current.
        activity_written_time=previous.activity_written_time,
        last_sleep_time=_time(memory.last_sleep_time),
        last_wake_time=_time(memory.last_wake_time),
        last_wake_seconds=(
            None if memory.last_wake_seconds is None else round(memory.last_wake_seconds, 3)
        ),
        replicas=replicas,
        scaled_from_replicas=memory.scaled_from,
        scaled_to_zero_time=_time(memory.scaled_at),
        scale_up_time=_time(memory.scale_up_time),
        manual_scale_time=_time(memory.manual_at),
        conditions=conditions(previous.conditions, values, now=now, generation=generation),
        observed_generation=generation,
        # What the foresight owns (operator/model/foresight.py) stands until it is written anew.
        active_window=previous.active_window,
        next_window=previous.next_window,
        prewake=previous.prewake,
    )


def _engine_fields(entry: PodStatus, engine: EngineMemory, state: str) -> None:
    """What a pod entry says of an engine the operator has followed, and why it is in its
    state when that is worth saying (a failed wake's message outranks a failed sleep's)."""
    entry.since = _time(engine.state_since.get(state))
    entry.last_activity_time = moment(_coarse(engine.last_activity))
    entry.wake_failures = engine.wake_failures
    message: str | None = engine.probe_error if state == "unreachable" else None
    if engine.sleep_failures:
        entry.sleep_failures = engine.sleep_failures
        entry.sleep_failure_reason = engine.sleep_failure_reason
        message = engine.sleep_failure_message or None
    if engine.wake_failures:
        entry.failure_reason = engine.last_failure_reason
        entry.last_failure_time = _time(engine.last_failure)
        message = engine.last_failure_message
    if message is not None:
        entry.message = message


def only_activity_moved(old: InferenceModelStatus, new: InferenceModelStatus) -> bool:
    """Whether `new` differs from `old` only in activity times (the model's, its pods')."""
    return _without_activity(old) == _without_activity(new)


def _without_activity(status: InferenceModelStatus) -> InferenceModelStatus:
    return status.model_copy(
        update={
            "last_activity_time": None,
            "activity_written_time": None,
            "pods": [p.model_copy(update={"last_activity_time": None}) for p in status.pods],
        }
    )


@dataclass(frozen=True, kw_only=True)
class Serving:
    """What decides whether a model can serve: its engines, its spec, its workload."""

    count: dict[EngineState, int]
    """Ready, reachable engines by published state."""
    ready: int
    selected: int
    unreachable: int
    spec_error: str | None
    name_taken: bool
    can_wake: bool
    scaled_to_zero: bool
    scaling_up: bool


def _ready(serving: Serving, *, selector: str, namespace: str) -> ConditionValue:
    """Ready as Kubernetes users read it (`kubectl wait --for=condition=Ready`): the model can
    serve a request now, from an awake engine or by waking one; a model asleep is Ready."""
    s = serving
    awake, asleep = s.count[EngineState.AWAKE], s.count[EngineState.ASLEEP]
    waking, draining = s.count[EngineState.WAKING], s.count[EngineState.DRAINING]
    cannot_wake = (
        "nothing wakes it: wake.onRequest is false or desiredState is Asleep; set "
        "desiredState to Auto (with wake.onRequest) or Awake"
    )

    def ready(status: bool, reason: str, message: str) -> ConditionValue:
        return ConditionValue(
            type=ConditionType.READY, status=status, reason=reason, message=message
        )

    if s.spec_error is not None:
        return ready(
            False, ConditionReason.INVALID_SPEC, "the spec is invalid: see the SpecValid condition"
        )
    if s.name_taken:
        return ready(
            False,
            ConditionReason.MODEL_NAME_TAKEN,
            "another InferenceModel holds this model name: see the Conflict condition",
        )
    if awake:
        return ready(
            True, ConditionReason.ENGINES_AWAKE, f"{awake} of {s.ready} ready engines awake"
        )
    if s.scaled_to_zero:
        if s.can_wake:
            return ready(
                True,
                ConditionReason.SCALED_TO_ZERO,
                "at zero replicas; a request scales it back up",
            )
        return ready(False, ConditionReason.SCALED_TO_ZERO, f"at zero replicas, and {cannot_wake}")
    if s.scaling_up:
        return ready(
            True, ConditionReason.SCALING_UP, "scaling back up; requests are held until it answers"
        )
    if s.selected == 0 and selector:
        return ready(False, ConditionReason.NO_PODS, no_pods_message(selector, namespace))
    if s.ready == 0:
        return ready(
            False, ConditionReason.NO_ENGINES, f"{s.selected} pod(s) selected, none Ready yet"
        )
    if waking:
        return ready(True, ConditionReason.WAKING, f"{waking} of {s.ready} ready engines waking")
    if asleep or draining:
        if s.can_wake:
            return ready(
                True,
                ConditionReason.ABLE_TO_WAKE,
                f"{asleep} of {s.ready} ready engines asleep, {draining} draining; a request "
                "wakes one",
            )
        return ready(False, ConditionReason.WAKE_DISABLED, f"asleep, and {cannot_wake}")
    if s.count[EngineState.FAILED]:
        return ready(
            False,
            ConditionReason.WAKE_FAILED,
            "no engine could be woken: see the WakeFailed condition",
        )
    if s.unreachable:
        return ready(
            False,
            ConditionReason.ENGINES_UNREACHABLE,
            f"{s.unreachable} of {s.ready} ready engines do not answer: see status.pods",
        )
    return ready(
        False, ConditionReason.NO_ENGINE_AWAKE, f"none of {s.ready} ready engines is awake"
    )


def no_pods_message(selector: str, namespace: str) -> str:
    where = f"namespace {namespace}" if namespace else "its namespace"
    return (
        f"no pod in {where} matches the selector {selector}: check spec.selector against the "
        f"pods' labels (kubectl get pods -n {namespace or 'NAMESPACE'} --show-labels)"
    )


def _wake_failed(failing: Sequence[tuple[str, str, str]]) -> ConditionValue:
    if not failing:
        return ConditionValue(
            type=ConditionType.WAKE_FAILED,
            status=False,
            reason=ConditionReason.NO_FAILURES,
            message="no failed wake",
        )
    pod, reason, message = failing[0]
    more = f" (and {len(failing) - 1} more pods)" if len(failing) > 1 else ""
    return ConditionValue(
        type=ConditionType.WAKE_FAILED,
        status=True,
        reason=reason or ConditionReason.WAKE_FAILED,
        message=f"{pod}{more}: {message}",
    )


def _sleep_failed(failing: Sequence[EngineMemoryView]) -> ConditionValue:
    if not failing:
        return ConditionValue(
            type=ConditionType.SLEEP_FAILED,
            status=False,
            reason=ConditionReason.NO_FAILURES,
            message="no failed sleep",
        )
    pod, engine = failing[0]
    more = f" (and {len(failing) - 1} more pods)" if len(failing) > 1 else ""
    if engine.sleep_blocked is not None:
        what = (
            "it stays awake and keeps serving, and Snooze tries again once the pod is "
            "replaced or the spec changes"
        )
    else:
        what = "it stays awake meanwhile; Snooze tries again later"
    return ConditionValue(
        type=ConditionType.SLEEP_FAILED,
        status=True,
        reason=engine.sleep_failure_reason or ConditionReason.SLEEP_FAILED,
        message=f"{pod}{more} cannot sleep: {what}. {engine.sleep_failure_message}".rstrip(),
    )


def _unreachable(memory: ModelMemory, pod: PodInfo) -> bool:
    engine = memory.engines.get(pod.name)
    return pod.ready and engine is not None and engine.unreachable
