"""The GPU pool decision: which members may wake now, which sleep to make room, at what level.

One device's memory is shared by several engines (members). At every instant the footprints
of awake, waking, draining and starting members plus what sleeping members still hold must
not exceed the device's memory. Model loops ask for wakes; this decides, per pool, in one
place:
- wakes are served first come, first served; one that does not fit waits, and so does every
  later one (no later wake takes the room an earlier one waits for: none starves);
- room is made by putting awake members to sleep: never a busy one, never one woken less
  than `min_residency` ago, never one its model needs (desiredState Awake, minAwake), never
  one of the model that asks; lower priorities first, then by the pool's eviction order;
- a wake is granted only once the memory is free: a member put to sleep still holds its
  footprint until its engine has confirmed the sleep (it is `draining` until then);
- with a headroom, once no wake waits, members idle for its `idle_after` are put to sleep
  ahead of need until the next wakes of sleeping members would find room at once (a wake
  that meets a full device waits for a whole sleep, seconds, before its own wake begins);
- with priming, once the pool is quiet, one idle member that never slept at level 1 sleeps
  at level 1 and is woken again into its own room (a lazy ask): its first level-1 sleep pins
  host RAM and is several times slower than its later ones, so it is done ahead of need rather
  than on a request's path.
Pure: frozen views in, a decision out; tested by tables and properties.
"""

from __future__ import annotations

from collections.abc import Sequence

from snooze.policy.poolahead import headroom_evictions, prime_candidate
from snooze.policy.poolhost import holds_host_memory, host_memory_used, sleep_levels
from snooze.policy.poolorder import at_min_awake, evictable, eviction_order, request_rate
from snooze.policy.pooltypes import (
    CANCELLABLE,
    HEADROOM,
    HOLDS_FOOTPRINT,
    PRIME,
    RECENT_WINDOW_SECONDS,
    Headroom,
    Member,
    MemberState,
    ModelNeeds,
    PoolDecision,
    PoolView,
    Prime,
    Waiting,
    WakeAsk,
)

__all__ = [
    "CANCELLABLE",
    "HEADROOM",
    "HOLDS_FOOTPRINT",
    "PRIME",
    "RECENT_WINDOW_SECONDS",
    "Headroom",
    "Member",
    "MemberState",
    "ModelNeeds",
    "PoolDecision",
    "PoolView",
    "Prime",
    "Waiting",
    "WakeAsk",
    "decide_pool",
    "eviction_order",
    "holds_host_memory",
    "host_memory_used",
    "overcommitted",
    "request_rate",
]


def decide_pool(view: PoolView) -> PoolDecision:
    """The members to wake and to put to sleep now; see the module's docstring."""
    members = {m.pod: m for m in view.members}
    used = sum(m.held for m in view.members)
    free = view.memory - used
    # Sleeps under way (draining) give their memory back once confirmed, in this order.
    releasing = sorted(
        (m.frees for m in view.members if m.state is MemberState.DRAINING), reverse=True
    )
    awake_count: dict[str, int] = {}
    for m in view.members:
        if m.state is MemberState.AWAKE:
            awake_count[m.model] = awake_count.get(m.model, 0) + 1
    candidates = [m for m in view.members if evictable(m, view)]
    candidates = eviction_order(candidates, view.eviction, view.now)

    grant: set[str] = set()
    evict: dict[str, str] = {}
    waiting: list[Waiting] = []
    asleep_asks = [
        a for a in view.asks if a.pod in members and members[a.pod].state is MemberState.ASLEEP
    ]
    eager = {a.pod for a in asleep_asks if not a.lazy}
    asks = sorted((a for a in asleep_asks if not a.lazy), key=lambda a: (a.asked_at, a.pod))
    lazy = sorted(
        (a for a in asleep_asks if a.lazy and a.pod not in eager),
        key=lambda a: (a.asked_at, a.pod),
    )
    # Starting members take their footprint as soon as it is free: a deficit they cause is
    # made good first, as if they had asked before anyone.
    queue: list[tuple[Member | None, int]] = [(None, 0)] if free < 0 else []
    queue += [(members[a.pod], members[a.pod].frees) for a in asks]
    blocked = False
    for member, need in queue:
        if blocked:
            if member is not None:
                waiting.append(_wait(member, need, False, "an earlier wake waits for room"))
            continue
        if member is not None and need <= free:
            grant.add(member.pod)
            free -= need
            continue
        short = need - free  # a deficit (free < 0) is made good along with it
        free = 0  # what was free is this wake's now, whatever happens next
        while short > 0 and releasing:
            short -= releasing.pop(0)
        chosen: list[Member] = []
        for candidate in list(candidates):
            if short <= 0:
                break
            if member is not None and candidate.model == member.model:
                continue
            if at_min_awake(view, awake_count, candidate.model):
                continue
            chosen.append(candidate)
            candidates.remove(candidate)
            awake_count[candidate.model] -= 1
            short -= candidate.frees
        if short > 0:
            # Not enough can be made free now: evict nothing in vain, and let nobody pass.
            for candidate in chosen:
                awake_count[candidate.model] += 1
            blocked = True
            if member is not None:
                waiting.append(_wait(member, need, False, _why_blocked(view, member)))
            continue
        if short < 0:
            releasing.insert(0, -short)  # freed beyond this wake: room planned for the next
        starting = sorted(m.pod for m in view.members if m.state is MemberState.STARTING)
        for candidate in chosen:
            evict[candidate.pod] = (
                member.model if member is not None else f"starting {', '.join(starting)}"
            )
        if member is not None:
            waiting.append(_wait(member, need, True, "members are being put to sleep for it"))
    quiet = not waiting and free >= 0
    if quiet:
        for ask in lazy:
            member = members[ask.pod]
            if member.frees <= free:
                grant.add(member.pod)
                free -= member.frees
    if view.headroom is not None and quiet:
        room = free + sum(releasing)
        spare = headroom_evictions(view, view.headroom, candidates, room, grant, awake_count)
        for candidate in spare:
            evict[candidate.pod] = HEADROOM
    levels = sleep_levels(view)
    if view.prime is not None and quiet and not evict and not grant and not view.asks:
        primed = prime_candidate(view, view.prime, candidates, awake_count)
        if primed is not None:
            evict[primed.pod] = PRIME
            levels[primed.pod] = 1
    held, unplaced = _placed(view)
    return PoolDecision(
        grant=frozenset(grant),
        evict=evict,
        levels=levels,
        waiting=waiting,
        used=held,
        unplaced=unplaced,
    )


def _placed(view: PoolView) -> tuple[int, frozenset[str]]:
    """What the device holds now, and the starting members it has no room for: vLLM refuses
    to load while the device's free memory is below its share, so such a member holds
    nothing (its container restarts) until room is made. The decision still counts them at
    their footprint, so that room is made for them."""
    held = sum(m.held for m in view.members if m.state is not MemberState.STARTING)
    unplaced: set[str] = set()
    starting = (m for m in view.members if m.state is MemberState.STARTING)
    for member in sorted(starting, key=lambda m: m.pod):
        if held + member.footprint <= view.memory:
            held += member.footprint
        else:
            unplaced.add(member.pod)
    return held, frozenset(unplaced)


def _wait(member: Member, need: int, making_room: bool, reason: str) -> Waiting:
    return Waiting(
        pod=member.pod, model=member.model, need=need, making_room=making_room, reason=reason
    )


def _why_blocked(view: PoolView, asking: Member) -> str:
    awake = [m for m in view.members if m.state is MemberState.AWAKE and m.model != asking.model]
    busy = sum(1 for m in awake if m.busy)
    young = sum(
        1
        for m in awake
        if not m.busy
        and m.awake_since is not None
        and view.now - m.awake_since < view.min_residency
    )
    kept = len(awake) - busy - young
    parts = [
        f"{n} {what}"
        for n, what in (
            (busy, "busy"),
            (young, "woken less than minResidency ago"),
            (kept, "kept awake by their models (minAwake, desiredState)"),
        )
        if n
    ]
    return "no awake member can make room: " + (
        ", ".join(parts) if parts else "there is none; the pool is too small for it"
    )


def overcommitted(memory: int, members: Sequence[Member]) -> str | None:
    """Why the declared footprints cannot be met even with all members but one asleep, or None.

    The arithmetic is in the message, so that a person sees what to change.
    """
    for member in members:
        others = sum(m.residue for m in members if m.pod != member.pod)
        if member.footprint + others > memory:
            return (
                f"{member.pod} ({member.model}) needs {member.footprint} bytes awake, and the "
                f"{len(members) - 1} other members hold {others} bytes asleep: "
                f"{member.footprint} + {others} = {member.footprint + others} > {memory} bytes "
                "of the pool. Lower the footprint (spec.pool.memory, vLLM's "
                "--gpu-memory-utilization), the members' asleepMemory, or their number"
            )
    return None
