"""What a quiet GPU pool does ahead of need: headroom (idle members sleep so that the next wakes
find room at once) and prime (each member's first, slow level-1 sleep done while nobody waits)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from snooze.policy.pool.host import host_memory_used, host_taken
from snooze.policy.pool.order import at_min_awake
from snooze.policy.pool.types import Headroom, Member, MemberState, PoolView, Prime


def headroom_evictions(
    view: PoolView,
    headroom: Headroom,
    candidates: Sequence[Member],
    room: int,
    woken: set[str],
    awake_count: Mapping[str, int],
    host: int | None = None,
) -> list[Member]:
    """The idle members to put to sleep so that `room` (free now, or once the sleeps under way
    are confirmed) covers the wakes of the `wakes` largest sleepers; none if it cannot be
    covered (nothing is slept in vain). `host`: the host memory left for the copies of members
    that cannot discard (None: not bounded)."""
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
        if at_min_awake(view, awake, candidate.model):
            continue
        if host is not None and host_taken(candidate) > host:
            continue  # its copy would not fit beside those of the members chosen before it
        chosen.append(candidate)
        awake[candidate.model] -= 1
        short -= candidate.frees
        host = None if host is None else host - host_taken(candidate)
    return chosen if short <= 0 else []


def prime_candidate(
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
        if at_min_awake(view, awake_count, candidate.model):
            continue
        if view.host_memory is not None and host_used + candidate.weights > view.host_memory:
            continue
        return candidate
    return None
