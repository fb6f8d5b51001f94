"""Which awake members of a GPU pool may sleep to make room, and in which order."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from snooze.api.gpupool import Eviction
from snooze.policy.pool.types import (
    RECENT_WINDOW_SECONDS,
    Member,
    MemberState,
    ModelNeeds,
    PoolView,
)


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


def may_ever_sleep(member: Member, view: PoolView) -> bool:
    """Awake, idle, not kept awake by its model's desiredState, and its sleep frees something
    (not a member whose sleep the pool no longer trusts, counted at its whole footprint
    asleep): it may be put to sleep for another member once past its minimum residency
    (`young`)."""
    if member.state is not MemberState.AWAKE or member.busy or member.frees <= 0:
        return False
    return not view.models.get(member.model, ModelNeeds()).keep_awake


def young(member: Member, view: PoolView, asked_at: float | None = None) -> bool:
    """Woken less than min_residency ago, so not put to sleep for another member; except for a
    wake asked before the one that woke it (`asked_at`): it passed that wake while the wake
    could not be served, and gives the room back as soon as it is idle."""
    since = member.awake_since
    if since is None or view.now - since >= view.min_residency:
        return False
    passed = asked_at is not None and member.woken_for is not None and member.woken_for > asked_at
    return not passed


def at_min_awake(view: PoolView, awake_count: Mapping[str, int], model: str) -> bool:
    """Whether one more of the model's members asleep would leave it below its minAwake."""
    return awake_count.get(model, 0) <= view.models.get(model, ModelNeeds()).min_awake
