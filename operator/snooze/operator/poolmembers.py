"""What a GPU pool's coordinator reads of its members: the pods of the model loops that are on
the pool's device, and for each its state, footprint and activity as its model's loop knows it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from snooze.api.agreed import POOL_LABEL
from snooze.api.gpupool import GPUPoolSpec
from snooze.api.models import EngineState, InferenceModelSpec
from snooze.kube.pods import PodInfo
from snooze.operator.memory import EngineMemory, process_of
from snooze.policy.pool import Member, MemberState
from snooze.policy.probing import Traffic
from snooze.policy.runs import Process

# vLLM's --gpu-memory-utilization when none is given (0.9 before 0.33, 0.92 since): what an
# engine takes on its device when nothing says otherwise.
DEFAULT_SHARE = 0.92
# What a wake costs by level when the model has no measured one yet (docs/vllm-contract.md's
# published figures).
WAKE_SECONDS = {1: 1.0, 2: 20.0}


class MemberSource(Protocol):
    """What a model's loop shows a pool of its engines (operator/loop.py's ModelLoop)."""

    name: str
    spec: InferenceModelSpec | None
    selected: list[PodInfo]
    min_awake_now: int
    """The engines its model keeps awake now: minAwake, or its keep-awake window's."""
    cycled: bool
    """Its first cycle has run, so `selected` says which pods it has."""

    @property
    def last_wake_seconds(self) -> float | None: ...

    def engine_memory(self, pod: str) -> EngineMemory | None: ...

    def poke(self) -> None: ...


def pool_name_of(
    pod: PodInfo, spec: InferenceModelSpec | None, claims: Mapping[str, str]
) -> str | None:
    """The pool a pod is a member of: its snooze.dev/pool label, else the pool whose
    ResourceClaim it references (`claims`: claim name -> pool), else its model's spec.pool."""
    label = pod.labels.get(POOL_LABEL)
    if label:
        return label
    for claim in sorted(pod.claims):
        if claim in claims:
            return claims[claim]
    return None if spec is None or spec.pool is None else spec.pool.name


def read_member(
    spec: GPUPoolSpec,
    source: MemberSource,
    pod: PodInfo,
    *,
    copies: Mapping[str, Process],
    traffic: Traffic | None,
    now: float,
) -> tuple[Member, Process]:
    """One member as its model's loop knows it now, and the engine process it runs (which the
    status's hostCopy speaks of); `copies` are the processes the pool's status says keep a
    host copy, `traffic` its requests through the gateway (None: unknown)."""
    model_spec = source.spec
    engine = source.engine_memory(pod.name)
    pool_spec = None if model_spec is None else model_spec.pool
    footprint = pool_spec.memory_bytes if pool_spec is not None else None
    if footprint is None:
        share = (engine.gpu_share if engine is not None else None) or pod.gpu_memory_utilization
        footprint = int((share or DEFAULT_SHARE) * spec.memory_bytes)
    residue = pool_spec.asleep_bytes if pool_spec is not None else 2**30
    weights = (pool_spec.weights_bytes if pool_spec is not None else None) or max(
        footprint - residue, 0
    )
    level: int = model_spec.sleep.level if model_spec is not None else 1
    state = member_state(pod, engine)
    if (
        state is MemberState.UNKNOWN
        and engine is not None
        and engine.last_failure_reason == "OutOfMemory"
        and engine.sleeping
        and not engine.acting
    ):
        # Its wake ran out of memory and it sleeps: part of it may still be mapped, so it
        # counts at its whole footprint; its next wake then needs no more room than that.
        state, residue = MemberState.ASLEEP, footprint
    if state is MemberState.ASLEEP and engine is not None and engine.sleep_level:
        level = engine.sleep_level
    process = process_of(pod, model_spec.engine.port if model_spec is not None else None)
    written = copies.get(pod.name)
    awake_since = None if engine is None else engine.state_since.get(EngineState.AWAKE.value)
    member = Member(
        pod=pod.name,
        model=source.name,
        state=state,
        footprint=footprint,
        residue=residue,
        priority=0 if pool_spec is None else pool_spec.priority,
        busy=is_busy(engine, traffic),
        last_used=engine.last_activity if engine is not None else now,
        recent_requests=engine.recent_requests(now) if engine is not None else 0,
        awake_since=awake_since,
        level=level,
        wake_seconds=source.last_wake_seconds or WAKE_SECONDS.get(level, 1.0),
        weights=weights,
        # Its engine process keeps a pinned copy of its weights: seen asleep at level 1
        # by this operator, or by the one before it (the status's copy of the same run).
        host_copy=(engine is not None and engine.holds_host_copy(process))
        or (written is not None and written.same_as(process)),
    )
    return member, process


def is_busy(engine: EngineMemory | None, traffic: Traffic | None) -> bool:
    """Whether its engine serves requests now: as its model's loop last saw it, or, when
    the gateway's counters are fresher than that loop's last probe (or its check before a
    sleep) and carry all of its traffic, as they say (the loop reads them once per
    interval; a pool waiting for a busy member reads every scrape)."""
    if engine is None:
        return False
    if traffic is None or engine.direct_activity:
        return engine.busy
    seen = max(engine.last_probe or 0.0, engine.busy_at or 0.0)
    return traffic.in_flight > 0 or (engine.busy and seen > traffic.at)


def member_state(pod: PodInfo, engine: EngineMemory | None) -> MemberState:
    """A member's state from what its model's loop knows now (its actions first: they run
    ahead of the labels they write)."""
    if not pod.ready:
        return MemberState.STARTING
    if engine is None:
        return MemberState.UNKNOWN
    if engine.acting_kind == "Wake":
        return MemberState.WAKING
    if engine.acting_kind == "Sleep":
        return MemberState.DRAINING
    if engine.last_failure_reason == "OutOfMemory":
        # A wake that ran out of memory may leave part of the engine mapped on the device.
        return MemberState.UNKNOWN
    if engine.sleeping is None:
        return MemberState.UNKNOWN
    if engine.sleeping:
        return MemberState.ASLEEP
    if pod.state is EngineState.DRAINING:
        return MemberState.DRAINING
    return MemberState.AWAKE
