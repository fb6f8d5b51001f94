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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from snooze.gpupool import Eviction


class MemberState(StrEnum):
    AWAKE = "awake"
    WAKING = "waking"
    DRAINING = "draining"
    ASLEEP = "asleep"
    STARTING = "starting"
    """The pod exists but its engine has not loaded: it takes its footprint as soon as it can."""
    UNKNOWN = "unknown"
    """Not observed (probe failed, or not probed yet): counted at its footprint, to be safe."""


RECENT_WINDOW_SECONDS = 600.0
"""How far back the Cheapest order counts a member's requests (ten minutes: several of a
bursty model's bursts, short enough that a model whose traffic stopped soon counts as unwanted)."""

# What a member holds on the device in each state: its footprint, or only its residue.
HOLDS_FOOTPRINT = frozenset(
    {
        MemberState.AWAKE,
        MemberState.WAKING,
        MemberState.DRAINING,
        MemberState.STARTING,
        MemberState.UNKNOWN,
    }
)


@dataclass(frozen=True, kw_only=True)
class Member:
    """One engine on the pool's device, as the pool sees it now."""

    pod: str
    model: str
    state: MemberState
    footprint: int
    """Device memory the engine takes awake, in bytes."""
    residue: int
    """Device memory it still holds asleep."""
    priority: int = 0
    busy: bool = False
    last_used: float = 0.0
    """When it last served a request (or woke)."""
    awake_since: float | None = None
    """When it last became awake: it is not evicted before min_residency has passed."""
    level: int = 1
    """The sleep level its model asks for (1 or 2); asleep, the level it sleeps at."""
    wake_seconds: float = 1.0
    """What a wake of it costs, as last measured (for the Cheapest eviction order)."""
    recent_requests: int = 0
    """Requests it finished in the last RECENT_WINDOW_SECONDS (for the Cheapest order)."""
    weights: int = 0
    """Host RAM its level-1 sleep takes."""
    host_copy: bool = False
    """Its process already holds that host RAM, asleep or awake: an earlier level-1 sleep pinned
    it, and PyTorch's caching host allocator keeps the blocks after the wake frees them, until
    the process ends. Its next level-1 sleep reuses them and takes no more."""

    @property
    def held(self) -> int:
        return self.footprint if self.state in HOLDS_FOOTPRINT else self.residue

    @property
    def frees(self) -> int:
        """What its sleep gives back to the device."""
        return max(self.footprint - self.residue, 0)


@dataclass(frozen=True, kw_only=True)
class ModelNeeds:
    """What a model's own spec says about keeping its members awake."""

    min_awake: int = 0
    keep_awake: bool = False
    """desiredState Awake: none of its members is put to sleep for another model."""


@dataclass(frozen=True, kw_only=True)
class WakeAsk:
    """A member its model loop wants awake."""

    pod: str
    asked_at: float
    """When it first asked; the queue's order."""
    lazy: bool = False
    """Woken back after a priming sleep: granted only into room that is free after every other
    ask, never by evicting anyone; it never waits (not granted, it sleeps on). The headroom
    then keeps its room by its own rule (members idle for its idle_after)."""


# What `PoolDecision.evict` says a member makes room for when no wake has asked yet.
HEADROOM = "headroom"
# What it says of a member put to sleep only to pin its host copy (it is woken back at once).
PRIME = "prime"
# The sleeps that promise their room to no wake: a request for the member may cancel them.
CANCELLABLE = frozenset({HEADROOM, PRIME})


@dataclass(frozen=True, kw_only=True)
class Headroom:
    """Room kept free ahead of wakes: for the next `wakes` wakes of the largest sleepers."""

    wakes: int = 1
    idle_after: float = 30.0
    """Only a member that has served nothing for this long sleeps for headroom."""


@dataclass(frozen=True, kw_only=True)
class Prime:
    """Members whose model sleeps at level 1 and whose process holds no pinned copy yet sleep
    once ahead of need, one at a time, while the pool is quiet, and are woken back at once."""

    idle_after: float = 10.0
    """Only a member that has served nothing for this long is primed."""


@dataclass(frozen=True, kw_only=True)
class PoolView:
    memory: int
    host_memory: int | None
    eviction: Eviction
    min_residency: float
    members: Sequence[Member]
    asks: Sequence[WakeAsk]
    models: Mapping[str, ModelNeeds] = field(default_factory=dict)
    now: float = 0.0
    headroom: Headroom | None = None
    prime: Prime | None = None


@dataclass(frozen=True, kw_only=True)
class Waiting:
    """A wake that cannot be granted yet, and why."""

    pod: str
    model: str
    need: int
    """The device memory it needs beyond what it holds asleep."""
    making_room: bool
    """Members are being put to sleep for it; False: nothing can be evicted for it now."""
    reason: str


@dataclass(frozen=True, kw_only=True)
class PoolDecision:
    grant: frozenset[str]
    """Members that may wake now."""
    evict: Mapping[str, str]
    """Members to put to sleep now, with what they make room for: the model whose wake asked,
    `starting POD[, POD]` for members that start, HEADROOM for wakes to come, or PRIME (it
    sleeps at level 1 only to pin its host copy, and is woken back by a lazy ask)."""
    levels: Mapping[str, int]
    """The level each awake member sleeps at if it sleeps now (host memory may force 2)."""
    waiting: Sequence[Waiting]
    used: int
    """Device memory held now (draining members at their footprint; starting members that
    do not fit hold nothing: their engine refuses to load until room is made)."""
    unplaced: frozenset[str] = frozenset()
    """Starting members for which the device has no room yet (in pod-name order, those that
    fit beside the others take their footprint first)."""


def request_rate(member: Member, now: float) -> float:
    """How soon a request for it is likely, as requests per second: its rate over the last
    RECENT_WINDOW_SECONDS plus one over the seconds since its last request. The rate keeps a
    model asked for in bursts from looking unwanted between two of them; the recency term
    orders members the window saw no request for."""
    idle = max(now - member.last_used, 0.0)
    return member.recent_requests / RECENT_WINDOW_SECONDS + 1.0 / (idle + 1.0)


def eviction_order(members: Iterable[Member], eviction: Eviction, now: float) -> list[Member]:
    """Awake members in the order they are put to sleep: lower priority first, then by the
    pool's eviction: LeastRecentlyUsed (longest unused first) or Cheapest (smallest expected
    cost: the wake it would need times how soon a request is likely, `request_rate`)."""

    def key(member: Member) -> tuple[float, float, str]:
        if eviction is Eviction.CHEAPEST:
            return (member.priority, member.wake_seconds * request_rate(member, now), member.pod)
        return (member.priority, -max(now - member.last_used, 0.0), member.pod)

    return sorted(members, key=key)


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
    candidates = [m for m in view.members if _evictable(m, view)]
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
            if _at_min_awake(view, awake_count, candidate.model):
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
        spare = _headroom_evictions(view, view.headroom, candidates, room, grant, awake_count)
        for candidate in spare:
            evict[candidate.pod] = HEADROOM
    levels = _levels(view)
    if view.prime is not None and quiet and not evict and not grant and not view.asks:
        primed = _prime_candidate(view, view.prime, candidates, awake_count)
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


def _prime_candidate(
    view: PoolView, prime: Prime, candidates: Sequence[Member], awake_count: Mapping[str, int]
) -> Member | None:
    """The member to prime now, if any: only where some member must sleep for another one day
    (not all fit awake together), only in a quiet pool (no member waking, sleeping or
    starting), and only an idle member that would sleep at level 1 and holds no copy yet,
    with room for that copy in the pool's host memory."""
    if sum(m.footprint for m in view.members) <= view.memory:
        return None
    settled = (MemberState.AWAKE, MemberState.ASLEEP)
    if any(m.state not in settled for m in view.members):
        return None
    host_used = host_memory_used(view.members)
    for candidate in candidates:
        if candidate.level != 1 or candidate.host_copy:
            continue
        if view.now - candidate.last_used < prime.idle_after:
            continue
        if _at_min_awake(view, awake_count, candidate.model):
            continue
        if view.host_memory is not None and host_used + candidate.weights > view.host_memory:
            continue
        return candidate
    return None


def _headroom_evictions(
    view: PoolView,
    headroom: Headroom,
    candidates: Sequence[Member],
    room: int,
    woken: set[str],
    awake_count: Mapping[str, int],
) -> list[Member]:
    """The idle members to put to sleep so that `room` (free now, or once the sleeps under way
    are confirmed) covers the wakes of the `wakes` largest sleepers; none if it cannot be
    covered (nothing is slept in vain)."""
    sleepers = sorted(
        (m.frees for m in view.members if m.state is MemberState.ASLEEP and m.pod not in woken),
        reverse=True,
    )
    short = sum(sleepers[: headroom.wakes]) - room
    if short <= 0:
        return []
    awake = dict(awake_count)  # after the evictions already chosen
    chosen: list[Member] = []
    for candidate in candidates:
        if short <= 0:
            break
        if view.now - candidate.last_used < headroom.idle_after:
            continue
        if _at_min_awake(view, awake, candidate.model):
            continue
        chosen.append(candidate)
        awake[candidate.model] -= 1
        short -= candidate.frees
    return chosen if short <= 0 else []


def _at_min_awake(view: PoolView, awake_count: Mapping[str, int], model: str) -> bool:
    """Whether one more of the model's members asleep would leave it below its minAwake."""
    return awake_count.get(model, 0) <= view.models.get(model, ModelNeeds()).min_awake


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


def _evictable(member: Member, view: PoolView) -> bool:
    if member.state is not MemberState.AWAKE or member.busy:
        return False
    if view.models.get(member.model, ModelNeeds()).keep_awake:
        return False
    since = member.awake_since
    return since is None or view.now - since >= view.min_residency


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


def holds_host_memory(member: Member) -> bool:
    """It holds its weights' size of host RAM now: a copy kept from an earlier level-1 sleep,
    or one it is making or keeps asleep."""
    return member.host_copy or (
        member.level == 1 and member.state in (MemberState.ASLEEP, MemberState.DRAINING)
    )


def host_memory_used(members: Iterable[Member]) -> int:
    return sum(m.weights for m in members if holds_host_memory(m))


def _levels(view: PoolView) -> dict[str, int]:
    """The level each awake member would sleep at: 1 while the pool's host memory holds its
    weights besides what the members hold there already (their copies, kept after a wake),
    else 2. A member whose process keeps a copy sleeps at level 1 at no further cost."""
    if view.host_memory is None:
        return {m.pod: m.level for m in view.members if m.state is MemberState.AWAKE}
    host_used = host_memory_used(view.members)
    levels: dict[str, int] = {}
    for member in eviction_order(
        (m for m in view.members if m.state is MemberState.AWAKE), view.eviction, view.now
    ):
        if member.level == 1 and member.host_copy:
            levels[member.pod] = 1
        elif member.level == 1 and host_used + member.weights <= view.host_memory:
            levels[member.pod] = 1
            host_used += member.weights
        else:
            levels[member.pod] = 2
    return levels


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
