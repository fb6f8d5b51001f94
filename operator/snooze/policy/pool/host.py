"""Host RAM in a GPU pool: the pinned copies of weights that level-1 sleeps make and keep, and
the level each member sleeps at so that they fit in the pool's hostMemory."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from snooze.policy.pool.order import eviction_order
from snooze.policy.pool.types import Member, MemberState, PoolView


def holds_host_memory(member: Member) -> bool:
    """It holds its weights' size of host RAM now: a copy kept from an earlier level-1 sleep,
    or one it is making or keeps asleep."""
    return member.host_copy or (
        member.level == 1 and member.state in (MemberState.ASLEEP, MemberState.DRAINING)
    )


def host_memory_used(members: Iterable[Member]) -> int:
    return sum(m.weights for m in members if holds_host_memory(m))


def pinned(member: Member) -> bool:
    """It sleeps at level 1 whatever the pool asks (its release cannot wake from level 2), and
    its next sleep takes its weights' size of host RAM."""
    return member.level == 1 and not member.discards and not member.host_copy


def pinned_fits(member: Member, view: PoolView) -> bool:
    """Whether a member that cannot discard may sleep: only while the pool's host memory holds
    its weights beside what is held there now. A decision that puts several such members to
    sleep counts each against what those before it take (`host_taken`)."""
    if view.host_memory is None or not pinned(member) or member.state is not MemberState.AWAKE:
        return True
    return host_memory_used(view.members) + member.weights <= view.host_memory


def host_taken(member: Member) -> int:
    """The host RAM a member put to sleep now surely takes: the weights of one that cannot
    discard (the others' levels are chosen to fit, `sleep_levels`)."""
    return member.weights if pinned(member) and member.state is MemberState.AWAKE else 0


def host_free(view: PoolView) -> int | None:
    """The pool's host memory not held now (None: not bounded)."""
    if view.host_memory is None:
        return None
    return view.host_memory - host_memory_used(view.members)


def sleep_levels(view: PoolView, sleeping_now: Sequence[str] = ()) -> dict[str, int]:
    """The level each awake member would sleep at: 1 while the pool's host memory holds its
    weights besides what the members hold there already (their copies, kept after a wake),
    else 2. A member whose process keeps a copy sleeps at level 1 at no further cost.
    `sleeping_now`: the members a decision puts to sleep, in its order; they are served
    first."""
    if view.host_memory is None:
        return {m.pod: m.level for m in view.members if m.state is MemberState.AWAKE}
    host_used = host_memory_used(view.members)
    levels: dict[str, int] = {}
    awake = [m for m in view.members if m.state is MemberState.AWAKE]
    # A member that cannot discard sleeps at level 1 whatever it is told: its host RAM is
    # counted first, so that the others' levels leave room for it; so is that of one that
    # will be awake (starting, waking, not known yet), or the others' copies would take the
    # room before it could ever sleep.
    for member in view.members:
        if member.level != 1 or member.discards:
            continue
        if member.state is MemberState.AWAKE:
            levels[member.pod] = 1
        if not holds_host_memory(member):
            host_used += member.weights
    # The host memory goes first to the members that sleep now, then to the others in the
    # order they would be put to sleep: a member first in that order but kept awake (woken
    # less than minResidency ago, busy) must not take the room of one that sleeps now.
    now_first = {pod: i for i, pod in enumerate(sleeping_now)}
    rest = eviction_order((m for m in awake if m.pod not in levels), view.eviction, view.now)
    for member in sorted(rest, key=lambda m: now_first.get(m.pod, len(now_first))):
        if member.level == 1 and member.host_copy:
            levels[member.pod] = 1
        elif member.level == 1 and host_used + member.weights <= view.host_memory:
            levels[member.pod] = 1
            host_used += member.weights
        else:
            levels[member.pod] = 2
    return levels
