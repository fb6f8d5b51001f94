"""What a GPU pool's coordinator reads of its members: for each pod of a model's snapshot on the
pool's device, its state, footprint and activity as its model's loop knew them then."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from snooze.api.gpupool import GPUPoolSpec
from snooze.api.models import DesiredState, EngineState
from snooze.api.reasons import FailureReason
from snooze.kube.pods import PodInfo
from snooze.operator.pool.snapshot import EngineFacts, ModelSnapshot, PodSnapshot
from snooze.policy.knownbugs import SGLANG
from snooze.policy.pool.decision import Member, MemberState, ModelNeeds
from snooze.policy.probing import Traffic
from snooze.policy.runs import Process

# vLLM's --gpu-memory-utilization when none is given (0.9 before 0.33, 0.92 since): what an
# engine takes on its device when nothing says otherwise.
DEFAULT_SHARE = 0.92
# What a wake costs by level when the model has no measured one yet (docs/vllm-contract.md's
# published figures).
WAKE_SECONDS = {1: 1.0, 2: 20.0}


def read_member(
    spec: GPUPoolSpec,
    model: ModelSnapshot,
    entry: PodSnapshot,
    *,
    copies: Mapping[str, Process],
    traffic: Traffic | None,
    now: float,
) -> Member:
    """One member as its model's loop knew it at the snapshot; `copies` are the engine runs
    the pool knows to keep a host copy (its status's, after a restart), `traffic` its
    requests through the gateway (None: unknown)."""
    pod, engine, process = entry.pod, entry.engine, entry.process
    model_spec = model.spec
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
        and engine.last_failure_reason == FailureReason.OUT_OF_MEMORY
        and engine.sleeping
        and engine.acting is None
    ):
        # Its wake ran out of memory and it sleeps: part of it may still be mapped, so it
        # counts at its whole footprint; its next wake then needs no more room than that.
        state, residue = MemberState.ASLEEP, footprint
    # Whether it can sleep at level 2, and so give up its host copy. An SGLang server's level
    # is its own flag: until its arguments are read, it is taken to keep a copy (its copy is
    # counted before the others', so that theirs never take the only room it has). A vLLM
    # engine whose release is not read yet is taken to discard, as nearly all do, until it is
    # awake: then its loop takes it for one that cannot (an unknown is not safe).
    sglang = model_spec is not None and model_spec.engine.kind == SGLANG
    discards = not sglang
    if engine is not None:
        # What its model asks may come to another level on its engine (a known bug, or a
        # release that cannot wake from level 2): the pool counts the level it will sleep at.
        level = engine.sleeps_at.get(level) or level
        if engine.levels_known or (not sglang and state is MemberState.AWAKE):
            discards = engine.sleeps_at.get(2, 2) != 1
    if state is MemberState.ASLEEP and engine is not None and engine.sleep_level:
        level = engine.sleep_level
    written = copies.get(pod.name)
    return Member(
        pod=pod.name,
        model=model.name,
        state=state,
        footprint=footprint,
        residue=residue,
        priority=0 if pool_spec is None else pool_spec.priority,
        busy=is_busy(engine, traffic),
        last_used=engine.last_activity if engine is not None else now,
        recent_requests=engine.recent_requests if engine is not None else 0,
        awake_since=None if engine is None else engine.awake_since,
        level=level,
        discards=discards,
        wake_seconds=model.last_wake_seconds or WAKE_SECONDS.get(level, 1.0),
        weights=weights,
        # Its engine process keeps a pinned copy of its weights: seen asleep at level 1
        # by this operator, or by the one before it (the status's copy of the same run).
        host_copy=(engine is not None and engine.host_copy)
        or (written is not None and written.same_as(process)),
    )


def is_busy(engine: EngineFacts | None, traffic: Traffic | None) -> bool:
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


def member_state(pod: PodInfo, engine: EngineFacts | None) -> MemberState:
    """A member's state from what its model's loop knows now (its actions first: they run
    ahead of the labels they write)."""
    if not pod.ready:
        return MemberState.STARTING
    if engine is None:
        return MemberState.UNKNOWN
    if engine.acting == "Wake":
        return MemberState.WAKING
    if engine.acting == "Sleep":
        return MemberState.DRAINING
    if engine.last_failure_reason == FailureReason.OUT_OF_MEMORY:
        # A wake that ran out of memory may leave part of the engine mapped on the device.
        return MemberState.UNKNOWN
    if engine.sleeping is None:
        return MemberState.UNKNOWN
    if engine.sleeping:
        return MemberState.ASLEEP
    if pod.state is EngineState.DRAINING:
        return MemberState.DRAINING
    return MemberState.AWAKE


@dataclass(frozen=True, kw_only=True)
class Gathered:
    """A pool's members as its models' snapshots show them now, and what the books need."""

    members: list[Member]
    needs: dict[str, ModelNeeds]
    """What each model with a member here keeps awake."""
    owners: dict[str, ModelSnapshot]
    """Member -> its model's snapshot."""
    processes: dict[str, Process]
    """Member -> its engine's run."""
    failures: dict[str, float]
    """Member -> when its last wake ran out of memory."""
    unasked: set[str]
    """Members asleep with no mark of a sleep of Snooze's."""
    restart_on_failure: set[str]
    """Members whose model's remedy for a failed engine is a restart."""


def gather(
    spec: GPUPoolSpec,
    models: Iterable[ModelSnapshot],
    *,
    copies: Mapping[str, Process],
    traffic: Callable[[str], Traffic | None],
    now: float,
) -> Gathered:
    """The pool's members from its models' snapshots (`traffic`: a pod's requests through the
    gateway, None if unknown)."""
    found = Gathered(
        members=[],
        needs={},
        owners={},
        processes={},
        failures={},
        unasked=set(),
        restart_on_failure=set(),
    )
    for model in models:
        for entry in model.pods:
            pod, engine = entry.pod.name, entry.engine
            found.owners[pod] = model
            found.processes[pod] = entry.process
            member = read_member(spec, model, entry, copies=copies, traffic=traffic(pod), now=now)
            found.members.append(member)
            if engine is not None and engine.last_failure_reason == FailureReason.OUT_OF_MEMORY:
                found.failures[pod] = engine.last_failure or 0.0
            if (
                member.state is MemberState.ASLEEP
                and engine is not None
                and engine.sleep_started is None
            ):
                found.unasked.add(pod)
            if model.spec is not None and model.spec.wake.on_failure == "Restart":
                found.restart_on_failure.add(pod)
        if model.spec is not None and model.pods:
            found.needs[model.name] = ModelNeeds(
                # A keep-awake window's minAwake too: a member kept awake by its model's
                # loop and put to sleep by the pool was woken again at once, putting a
                # neighbour to sleep each time (round after round, minResidency apart).
                min_awake=max(model.spec.min_awake, model.min_awake_now),
                keep_awake=model.spec.desired_state is DesiredState.AWAKE,
            )
    return found
