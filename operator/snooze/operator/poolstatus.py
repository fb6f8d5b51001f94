"""A GPUPool's status as its coordinator loop writes it: memory, members, waits and conditions."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from snooze.api.gpupool import GPUPoolSpec
from snooze.api.quantities import format_gib
from snooze.operator.memory import Process
from snooze.operator.status import ConditionValue, conditions
from snooze.policy.pool import (
    Member,
    MemberState,
    PoolDecision,
    holds_host_memory,
    host_memory_used,
)

JSON = dict[str, Any]


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
    previous: Mapping[str, Any],
    generation: int | None,
    now: float,
) -> JSON:
    """The status of a valid pool. `awake` and `asleep` are the bytes held by members awake
    and asleep, `problem` the Overcommitted message, `claim_holder` another pool that names
    this one's ResourceClaim, `processes` each member's engine run, `primed` the members
    asleep or going to sleep for the pool's prime, `untrusted` those counted at their whole
    footprint because the pool does not trust their sleep to free their memory."""
    memory = spec.memory_bytes
    claim = spec.resource_claim_name
    values = [
        ConditionValue(type="SpecValid", status=True, reason="Valid", message=""),
        ConditionValue(
            type="ClaimConflict",
            status=claim_holder is not None,
            reason="ClaimNamedTwice" if claim_holder is not None else "NoConflict",
            message=(
                f"GPUPool {claim_holder} names ResourceClaim {claim} too and holds its pods: "
                "give each pool its own claim"
            )
            if claim_holder is not None
            else "no other pool names this pool's ResourceClaim",
        ),
        ConditionValue(
            type="MemoryNotFreed",
            status=bool(untrusted),
            reason="SleepKeepsMemory" if untrusted else "Trusted",
            message=(
                f"not trusted to free their memory asleep, so counted at their whole footprint: "
                f"{', '.join(sorted(untrusted))} (the pool's Events say why)"
            )
            if untrusted
            else "every member's sleep is trusted to give its memory back",
        ),
        ConditionValue(
            type="Overcommitted",
            status=problem is not None,
            reason="FootprintsExceedMemory" if problem else "Fits",
            message=problem or "every member fits awake beside the others asleep",
        ),
    ]
    return {
        "memoryBytes": memory,
        "usedBytes": decision.used,
        "awakeBytes": awake,
        "asleepBytes": asleep,
        "freeBytes": memory - decision.used,
        "used": f"{format_gib(decision.used)}/{format_gib(memory)}",
        "awake": sum(1 for m in members if m.state is MemberState.AWAKE),
        "hostMemoryBytes": spec.host_memory_bytes,
        "hostUsedBytes": host_memory_used(members),
        "members": [
            {
                "pod": m.pod,
                "model": m.model,
                "state": _shown_state(m, decision),
                "footprintBytes": m.footprint,
                "holdsBytes": 0 if m.pod in decision.unplaced else m.held,
                "hostBytes": m.weights if holds_host_memory(m) else 0,
                "hostCopy": m.host_copy,
                **_process_fields(processes.get(m.pod)),
                "priority": m.priority,
                "primed": m.pod in primed,
                "untrusted": m.pod in untrusted,
            }
            for m in sorted(members, key=lambda m: m.pod)
        ],
        "waiting": len(decision.waiting),
        "waitingModels": list(dict.fromkeys(w.model for w in decision.waiting)),
        "evictions": evictions,
        "conditions": conditions(
            previous.get("conditions") or [], values, now=now, generation=generation
        ),
        "observedGeneration": generation,
    }


def invalid_pool_status(
    message: str, *, previous: Mapping[str, Any], generation: int | None, now: float
) -> JSON:
    """The status of a pool whose spec is invalid: SpecValid False, saying what to fix."""
    values = [
        ConditionValue(
            type="SpecValid",
            status=False,
            reason="InvalidSpec",
            message=f"{message}. Fix the spec: its members wake for nobody until then.",
        )
    ]
    return {
        "conditions": conditions(
            previous.get("conditions") or [], values, now=now, generation=generation
        ),
        "observedGeneration": generation,
    }


def _process_fields(process: Process | None) -> JSON:
    if process is None:
        return {"podUid": "", "restarts": None}
    return {"podUid": process.pod_uid, "restarts": process.restarts}


def _shown_state(member: Member, decision: PoolDecision) -> str:
    if member.pod in decision.evict:
        return "evicting"
    if member.pod in decision.unplaced:
        return "waitingForRoom"  # starting, and refused by the device until room is made
    return member.state.value
