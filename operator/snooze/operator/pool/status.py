"""A GPUPool's status as its coordinator loop writes it: memory, members, waits and conditions."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from snooze.api.conditions import ConditionReason, ConditionType
from snooze.api.gpupool import GPUPoolSpec, GPUPoolStatus, PoolMember, PoolMemberState
from snooze.api.quantities import format_gib
from snooze.operator.status.model import ConditionValue, conditions
from snooze.policy.pool.decision import (
    Member,
    MemberState,
    PoolDecision,
    holds_host_memory,
    host_memory_used,
)
from snooze.policy.runs import Process


def pool_status(
    spec: GPUPoolSpec,
    members: list[Member],
    decision: PoolDecision,
    *,
    awake: int,
    asleep: int,
    problem: str | None,
    claim_holder: str | None,
    processes: Mapping[str, Process],
    primed: Collection[str],
    untrusted: Collection[str] = (),
    evictions: int,
    previous: GPUPoolStatus,
    generation: int | None,
    now: float,
) -> GPUPoolStatus:
    """The status of a valid pool. `awake` and `asleep` are the bytes held by members awake
    and asleep, `problem` the Overcommitted message, `claim_holder` another pool that names
    this one's ResourceClaim, `processes` each member's engine run, `primed` the members
    asleep or going to sleep for the pool's prime, `untrusted` those counted at their whole
    footprint because the pool does not trust their sleep to free their memory."""
    memory = spec.memory_bytes
    claim = spec.resource_claim_name
    values = [
        ConditionValue(
            type=ConditionType.SPEC_VALID, status=True, reason=ConditionReason.VALID, message=""
        ),
        ConditionValue(
            type=ConditionType.CLAIM_CONFLICT,
            status=claim_holder is not None,
            reason=ConditionReason.CLAIM_NAMED_TWICE
            if claim_holder is not None
            else ConditionReason.NO_CONFLICT,
            message=(
                f"GPUPool {claim_holder} names ResourceClaim {claim} too and holds its pods: "
                "give each pool its own claim"
            )
            if claim_holder is not None
            else "no other pool names this pool's ResourceClaim",
        ),
        ConditionValue(
            type=ConditionType.MEMORY_NOT_FREED,
            status=bool(untrusted),
            reason=ConditionReason.SLEEP_KEEPS_MEMORY if untrusted else ConditionReason.TRUSTED,
            message=(
                f"not trusted to free their memory asleep, so counted at their whole footprint: "
                f"{', '.join(sorted(untrusted))} (the pool's Events say why)"
            )
            if untrusted
            else "every member's sleep is trusted to give its memory back",
        ),
        ConditionValue(
            type=ConditionType.OVERCOMMITTED,
            status=problem is not None,
            reason=ConditionReason.FOOTPRINTS_EXCEED_MEMORY if problem else ConditionReason.FITS,
            message=problem or "every member fits awake beside the others asleep",
        ),
    ]
    return GPUPoolStatus(
        memory_bytes=memory,
        used_bytes=decision.used,
        awake_bytes=awake,
        asleep_bytes=asleep,
        free_bytes=memory - decision.used,
        used=f"{format_gib(decision.used)}/{format_gib(memory)}",
        awake=sum(1 for m in members if m.state is MemberState.AWAKE),
        host_memory_bytes=spec.host_memory_bytes,
        host_used_bytes=host_memory_used(members),
        members=[
            _member(m, decision, processes.get(m.pod), primed=m.pod in primed, untrusted=untrusted)
            for m in sorted(members, key=lambda m: m.pod)
        ],
        waiting=len(decision.waiting),
        waiting_models=list(dict.fromkeys(w.model for w in decision.waiting)),
        evictions=evictions,
        conditions=conditions(previous.conditions, values, now=now, generation=generation),
        observed_generation=generation,
    )


def _member(
    m: Member,
    decision: PoolDecision,
    process: Process | None,
    *,
    primed: bool,
    untrusted: Collection[str],
) -> PoolMember:
    return PoolMember(
        pod=m.pod,
        model=m.model,
        state=_shown_state(m, decision),
        footprint_bytes=m.footprint,
        holds_bytes=0 if m.pod in decision.unplaced else m.held,
        host_bytes=m.weights if holds_host_memory(m) else 0,
        host_copy=m.host_copy,
        pod_uid="" if process is None else process.pod_uid,
        restarts=None if process is None else process.restarts,
        priority=m.priority,
        primed=primed,
        untrusted=m.pod in untrusted,
    )


def invalid_pool_status(
    message: str, *, previous: GPUPoolStatus, generation: int | None, now: float
) -> GPUPoolStatus:
    """The status of a pool whose spec is invalid: SpecValid False, saying what to fix (what
    the pool said before stands)."""
    values = [
        ConditionValue(
            type=ConditionType.SPEC_VALID,
            status=False,
            reason=ConditionReason.INVALID_SPEC,
            message=f"{message}. Fix the spec: its members wake for nobody until then.",
        )
    ]
    return previous.model_copy(
        update={
            "conditions": conditions(previous.conditions, values, now=now, generation=generation),
            "observed_generation": generation,
        }
    )


def _shown_state(member: Member, decision: PoolDecision) -> PoolMemberState:
    if member.pod in decision.evict:
        return PoolMemberState.EVICTING
    if member.pod in decision.unplaced:
        return PoolMemberState.WAITING_FOR_ROOM  # refused by the device until room is made
    return PoolMemberState(member.state.value)
