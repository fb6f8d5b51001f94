"""The GPU pool decision: which members may wake now, which sleep to make room, at what level.

One device's memory is shared by several engines (members). At every instant the footprints
of awake, waking, draining and starting members plus what sleeping members still hold must
not exceed the device's memory. Model loops ask for wakes; this decides, per pool, in one
place. Who waits and who is served:
- wakes are taken in the order they were asked (first come, first served); each in turn is
  served if it can be now: granted into free memory, or members are put to sleep for it (or
  sleeps under way give it their memory). What serves it is not there for the wakes after it;
- a wake that cannot be served now (the members that could make its room are busy, woken
  less than `min_residency` ago, kept awake by their models, or of its own model) takes
  nothing: the wakes after it are served as if it had not asked. No wake waits behind one
  that cannot be served (no head-of-line blocking);
- and none starves: a member woken for a wake asked after a waiting one is not protected by
  `min_residency` from that earlier wake; once idle it is put to sleep for it if need be. A
  wake thus waits only for facts of the members it needs (busy, kept awake, woken before it
  asked and still inside `min_residency`), never for wakes asked after it;
- a wake whose requests are all gone (`abandoned`) keeps no place: it comes after every other
  wake, and only into free memory; nobody is put to sleep for it;
- room is made by putting awake members to sleep: never a busy one, never one woken less than
  `min_residency` ago (but for the above), never one its model needs (desiredState Awake,
  minAwake), never one of the model that asks; lower priorities first, then by the pool's
  eviction order. Nothing is put to sleep in vain: when what may sleep cannot free enough
  together, none sleeps;
- a wake is granted only once the memory is free: a member put to sleep still holds its
  footprint until its engine has confirmed the sleep (it is `draining` until then);
- starting members take their footprint as soon as it is free (vLLM loads when it finds its
  share free): room is made for each in turn, one member at a time, before any wake. One for
  which no room can be made now holds back none of the others, nor any wake whose room it
  could not take: a wake is served only while the most the device may have free before
  that wake takes its room stays below the footprint of every starting member left waiting;
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

import math
from collections.abc import Sequence
from dataclasses import dataclass

from snooze.api.quantities import format_gib
from snooze.policy.pool.ahead import headroom_evictions, prime_candidate
from snooze.policy.pool.host import (
    holds_host_memory,
    host_free,
    host_memory_used,
    host_taken,
    pinned_fits,
    sleep_levels,
)
from snooze.policy.pool.order import (
    at_min_awake,
    eviction_order,
    may_ever_sleep,
    request_rate,
    young,
)
from snooze.policy.pool.types import (
    BOOKS,
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
    RoomFor,
    RoomKind,
    Waiting,
    WakeAsk,
)

__all__ = [
    "BOOKS",
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
    "RoomFor",
    "RoomKind",
    "Waiting",
    "WakeAsk",
    "decide_pool",
    "eviction_order",
    "holds_host_memory",
    "host_memory_used",
    "overcommitted",
    "request_rate",
]

SERVED = "members are being put to sleep for it"
OVER = (
    "the pool's books count more than its device holds (a member whose sleep frees nothing): "
    "members are being put to sleep to make that good first"
)
OVER_STUCK = (
    "the pool's books count more than its device holds (a member whose sleep frees nothing), "
    "and no member may sleep to make that good now"
)
ABANDONED = (
    "the requests that asked for it are gone: it wakes only into free room, after every other "
    "wake, and nobody is put to sleep for it"
)


@dataclass
class _Room:
    """What the wakes taken so far have left to the next ones."""

    free: int
    """Free now (negative while starting members lack room)."""
    releasing: list[int]
    """What sleeps under way free once confirmed, not yet promised to a wake (largest first)."""
    candidates: list[Member]
    """Members that may sleep (some only for some wakes), in eviction order, not yet chosen."""
    awake: dict[str, int]
    """Awake members per model, after the evictions chosen so far."""
    host_free: int | None = None
    """The host memory left for the copies of members that cannot discard, once those chosen
    so far have taken theirs (None: not bounded)."""
    hole: int = 0
    """The most the device may have free before the grants and starts decided so far take
    their room: what is free, plus what every sleep under way or chosen frees."""


@dataclass(frozen=True)
class _Plan:
    releasing: int
    """How many of the sleeps under way it takes."""
    chosen: list[Member]
    surplus: int
    """What its room leaves over once made: planned for the next wake."""


def decide_pool(view: PoolView) -> PoolDecision:
    """The members to wake and to put to sleep now; see the module's docstring."""
    members = {m.pod: m for m in view.members}
    held, unplaced = _placed(view)
    room = _Room(
        free=view.memory - held,
        releasing=sorted(
            (m.frees for m in view.members if m.state is MemberState.DRAINING), reverse=True
        ),
        candidates=eviction_order(
            (m for m in view.members if may_ever_sleep(m, view) and pinned_fits(m, view)),
            view.eviction,
            view.now,
        ),
        awake={},
        host_free=host_free(view),
    )
    for m in view.members:
        if m.state is MemberState.AWAKE:
            room.awake[m.model] = room.awake.get(m.model, 0) + 1
    # The most the device may have free before the wakes granted and the members started
    # take their room: once every sleep under way or chosen now is done.
    room.hole = room.free + sum(room.releasing)

    grant: set[str] = set()
    evict: dict[str, RoomFor] = {}
    waiting: list[Waiting] = []
    over = room.free < 0
    making_good = False
    if over:
        # The books say more is held than the device has (a member counted at its footprint
        # whatever it said): that is made good first.
        plan = _plan(view, room, 0, None, None)
        if plan is not None:
            making_good = True
            for candidate in _commit(room, 0, plan):
                evict[candidate.pod] = BOOKS
    # Starting members take their footprint as soon as it is free: room is made for each in
    # turn (in pod-name order, as they are placed) before any wake. One for which no room can
    # be made now holds back none of the others, but a wake is served only where such a
    # member could not take its room (it loads whenever it finds its footprint free).
    threat = math.inf
    for pod in sorted(unplaced):
        member = members[pod]
        plan = _plan(view, room, member.footprint, member, None)
        if plan is None:
            why = _why_blocked(view, room, member, member.footprint, None)
            waiting.append(_wait(member, member.footprint, False, why))
            threat = min(threat, member.footprint)
            continue
        for candidate in _commit(room, member.footprint, plan):
            evict[candidate.pod] = RoomFor(RoomKind.START, pod)
        waiting.append(_wait(member, member.footprint, True, SERVED))
    asleep_asks = [
        a for a in view.asks if a.pod in members and members[a.pod].state is MemberState.ASLEEP
    ]
    eager = {a.pod for a in asleep_asks if not a.lazy}
    # The live wakes in the order they asked, then those whose requests are gone.
    asks = sorted(
        (a for a in asleep_asks if not a.lazy),
        key=lambda a: (a.abandoned, a.asked_at, a.pod),
    )
    lazy = sorted(
        (a for a in asleep_asks if a.lazy and a.pod not in eager),
        key=lambda a: (a.asked_at, a.pod),
    )
    for ask in asks:
        member = members[ask.pod]
        need = member.frees
        if need == 0 and over:
            # Counted at its whole footprint already (its last wake ran out of memory), it
            # needs part of it back: not while the books count more than the device has.
            waiting.append(_wait(member, need, making_good, OVER if making_good else OVER_STUCK))
            continue
        if need <= room.free and room.hole < threat:
            grant.add(member.pod)
            room.free -= need
            continue
        if ask.abandoned:
            waiting.append(_wait(member, need, False, ABANDONED, abandoned=True))
            continue
        plan = _plan(view, room, need, member, ask.asked_at)
        if plan is not None and room.hole + sum(c.frees for c in plan.chosen) >= threat:
            plan = None  # a starting member would take the room made for it
            why = _starting_takes(threat)
        elif plan is None:
            why = _why_blocked(view, room, member, need, ask.asked_at)
        if plan is None:
            # It cannot be served now: it takes nothing, and the wakes after it go on.
            waiting.append(_wait(member, need, False, why))
            continue
        for candidate in _commit(room, need, plan):
            evict[candidate.pod] = RoomFor(RoomKind.WAKE, member.pod)
        waiting.append(_wait(member, need, True, SERVED))
    # A wake whose requests are gone does not hold back what a quiet pool does.
    quiet = room.free >= 0 and all(w.abandoned for w in waiting)
    if quiet:
        for ask in lazy:
            member = members[ask.pod]
            if member.frees <= room.free:
                grant.add(member.pod)
                room.free -= member.frees
    if view.headroom is not None and quiet:
        candidates = [c for c in room.candidates if not young(c, view)]
        spare = headroom_evictions(
            view,
            view.headroom,
            candidates,
            room.free + sum(room.releasing),
            grant,
            room.awake,
            room.host_free,
        )
        for candidate in spare:
            evict[candidate.pod] = HEADROOM
    levels = sleep_levels(view, list(evict))
    live = [a for a in view.asks if not a.lazy and not a.abandoned]
    if view.prime is not None and quiet and not evict and not grant and not live:
        candidates = [c for c in room.candidates if not young(c, view)]
        primed = prime_candidate(view, view.prime, candidates, room.awake)
        if primed is not None:
            evict[primed.pod] = PRIME
            levels[primed.pod] = 1
    return PoolDecision(
        grant=frozenset(grant),
        evict=evict,
        levels=levels,
        waiting=waiting,
        used=held,
        unplaced=unplaced,
    )


def _plan(
    view: PoolView, room: _Room, need: int, asking: Member | None, asked_at: float | None
) -> _Plan | None:
    """How `need` bytes can be made free now from what is left (None: they cannot): what is
    free, then the sleeps under way, then members put to sleep, none of the asking model's."""
    short = need - room.free
    taken = 0
    for frees in room.releasing:
        if short <= 0:
            break
        short -= frees
        taken += 1
    awake = dict(room.awake)
    host = room.host_free
    chosen: list[Member] = []
    for candidate in room.candidates:
        if short <= 0:
            break
        if asking is not None and candidate.model == asking.model:
            continue
        if young(candidate, view, asked_at) or at_min_awake(view, awake, candidate.model):
            continue
        if host is not None and host_taken(candidate) > host:
            continue  # its copy would not fit beside those of the members chosen before it
        chosen.append(candidate)
        awake[candidate.model] -= 1
        short -= candidate.frees
        host = None if host is None else host - host_taken(candidate)
    if short > 0:
        return None
    return _Plan(releasing=taken, chosen=chosen, surplus=-short)


def _commit(room: _Room, need: int, plan: _Plan) -> list[Member]:
    """Take what `plan` uses from the room; the members it puts to sleep."""
    room.free = 0  # what was free (or the deficit made good) is this wake's now
    del room.releasing[: plan.releasing]
    if plan.surplus > 0:
        room.releasing.insert(0, plan.surplus)  # freed beyond its need: room for the next
    for candidate in plan.chosen:
        room.candidates.remove(candidate)
        room.awake[candidate.model] -= 1
        room.hole += candidate.frees
        if room.host_free is not None:
            room.host_free -= host_taken(candidate)
    return plan.chosen


def _placed(view: PoolView) -> tuple[int, frozenset[str]]:
    """What the device holds now, and the starting members it has no room for: vLLM refuses
    to load while the device's free memory is below its share, so such a member holds
    nothing (its container restarts) until room is made for it."""
    held = sum(m.held for m in view.members if m.state is not MemberState.STARTING)
    unplaced: set[str] = set()
    starting = (m for m in view.members if m.state is MemberState.STARTING)
    for member in sorted(starting, key=lambda m: m.pod):
        if held + member.footprint <= view.memory:
            held += member.footprint
        else:
            unplaced.add(member.pod)
    return held, frozenset(unplaced)


def _wait(
    member: Member, need: int, making_room: bool, reason: str, *, abandoned: bool = False
) -> Waiting:
    return Waiting(
        pod=member.pod,
        model=member.model,
        need=need,
        making_room=making_room,
        reason=reason,
        abandoned=abandoned,
    )


def _starting_takes(footprint: float) -> str:
    return (
        f"a starting member for which no room can be made now would take the room made for "
        f"it (it loads as soon as {format_gib(footprint)} is free)"
    )


def _why_blocked(
    view: PoolView, room: _Room, asking: Member, need: int, asked_at: float | None
) -> str:
    """Why no room can be made for `asking` now, counting each member that holds memory it
    lacks under the one reason that keeps it (and only true reasons)."""
    busy = young_count = kept = own = futile = pinned = 0
    freeable = sum(room.releasing)
    awake = dict(room.awake)
    candidates = {c.pod for c in room.candidates}
    host = room.host_free
    for m in eviction_order(
        (m for m in view.members if m.state is MemberState.AWAKE), view.eviction, view.now
    ):
        if m.model == asking.model:
            own += 1
        elif m.busy:
            busy += 1
        elif m.frees <= 0:
            futile += 1
        elif not may_ever_sleep(m, view):
            kept += 1  # desiredState Awake
        elif not pinned_fits(m, view):
            pinned += 1
        elif m.pod not in candidates:
            continue  # already put to sleep for an earlier wake
        elif young(m, view, asked_at):
            young_count += 1
        elif at_min_awake(view, awake, m.model):
            kept += 1
        elif host is not None and host_taken(m) > host:
            pinned += 1  # its copy would not fit beside those of the members counted before
        else:
            awake[m.model] -= 1
            freeable += m.frees
            host = None if host is None else host - host_taken(m)
    moving = sum(
        1
        for m in view.members
        if m.state in (MemberState.WAKING, MemberState.STARTING, MemberState.UNKNOWN)
    )
    parts = [
        f"{n} {what}"
        for n, what in (
            (busy, "busy"),
            (young_count, "woken less than minResidency ago"),
            (kept, "kept awake by their models (minAwake, desiredState)"),
            (own, "of its own model (never put to sleep for it)"),
            (futile, "whose sleep gives back no memory (memoryNotFreed)"),
            (pinned, "that can sleep only at level 1, whose weights hostMemory cannot hold"),
            (moving, "waking, starting or not yet seen"),
        )
        if n
    ]
    if freeable > 0:
        lacks = need - max(room.free, 0)
        head = (
            f"not enough room can be made: what may sleep or is going to sleep frees "
            f"{format_gib(freeable)} of the {format_gib(lacks)} it lacks"
        )
        return head + ("; the rest is held by " + ", ".join(parts) if parts else "")
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
