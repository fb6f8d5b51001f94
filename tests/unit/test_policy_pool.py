"""The GPU pool decision: tables of situations, and properties over random runs of a small world
in which members wake, sleep, get busy and idle while the clock moves."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snooze.api.gpupool import Eviction
from snooze.policy.pool.decision import (
    HEADROOM,
    PRIME,
    Headroom,
    Member,
    MemberState,
    ModelNeeds,
    PoolDecision,
    PoolView,
    Prime,
    RoomFor,
    RoomKind,
    WakeAsk,
    decide_pool,
    eviction_order,
    host_memory_used,
    overcommitted,
)

GIB = 2**30
NOW = 10_000.0
AWAKE, ASLEEP, DRAINING = MemberState.AWAKE, MemberState.ASLEEP, MemberState.DRAINING


def for_wake(pod: str) -> RoomFor:
    return RoomFor(RoomKind.WAKE, pod)


def for_start(pod: str) -> RoomFor:
    return RoomFor(RoomKind.START, pod)


def member(pod: str, state: MemberState = AWAKE, **kw: object) -> Member:
    args: dict[str, object] = {
        "pod": pod,
        "model": pod.split("-")[0],
        "state": state,
        "footprint": 30 * GIB,
        "residue": 1 * GIB,
        "last_used": NOW - 600,
        "awake_since": NOW - 600,
    }
    return Member(**(args | kw))  # type: ignore[arg-type]


# Not tests/builders.py's gpu_pool: the policy's view of a pool, its members and asks.
def pool(*members: Member, asks: dict[str, float] | None = None, **kw: object) -> PoolView:
    args: dict[str, object] = {
        "memory": 70 * GIB,
        "host_memory": None,
        "eviction": Eviction.LEAST_RECENTLY_USED,
        "min_residency": 30.0,
        "members": members,
        "asks": [WakeAsk(pod=p, asked_at=t) for p, t in (asks or {}).items()],
        "now": NOW,
    }
    return PoolView(**(args | kw))  # type: ignore[arg-type]


def test_a_wake_that_fits_is_granted_at_once() -> None:
    decision = decide_pool(pool(member("a-0"), member("b-0", ASLEEP), asks={"b-0": NOW}))
    assert decision.grant == {"b-0"}
    assert not decision.evict and not decision.waiting


def test_no_room_puts_the_least_recently_used_idle_member_to_sleep_first() -> None:
    view = pool(
        member("a-0", last_used=NOW - 100),
        member("b-0", last_used=NOW - 900),
        member("c-0", ASLEEP),
        asks={"c-0": NOW},
    )
    decision = decide_pool(view)
    assert decision.grant == set()
    assert dict(decision.evict) == {"b-0": for_wake("c-0")}
    [waiting] = decision.waiting
    assert waiting.pod == "c-0" and waiting.making_room


def test_the_wake_is_granted_only_once_the_sleep_is_confirmed() -> None:
    draining = pool(
        member("a-0"), member("b-0", DRAINING), member("c-0", ASLEEP), asks={"c-0": NOW}
    )
    decision = decide_pool(draining)
    assert decision.grant == set() and not decision.evict  # the drain in flight is enough
    assert decision.waiting[0].making_room
    asleep = pool(member("a-0"), member("b-0", ASLEEP), member("c-0", ASLEEP), asks={"c-0": NOW})
    assert decide_pool(asleep).grant == {"c-0"}


def test_a_busy_member_is_spared_for_an_idle_one() -> None:
    view = pool(
        member("a-0", busy=True, last_used=NOW - 5000),
        member("b-0", last_used=NOW),
        member("c-0", ASLEEP),
        asks={"c-0": NOW},
        min_residency=0.0,
    )
    assert dict(decide_pool(view).evict) == {"b-0": for_wake("c-0")}


def test_when_every_member_is_busy_or_protected_the_wake_waits_and_says_why() -> None:
    view = pool(
        member("a-0", busy=True),
        member("b-0", awake_since=NOW - 5),
        member("c-0", ASLEEP),
        asks={"c-0": NOW},
    )
    decision = decide_pool(view)
    assert not decision.grant and not decision.evict
    [waiting] = decision.waiting
    assert not waiting.making_room
    assert "1 busy" in waiting.reason and "minResidency" in waiting.reason


def test_lower_priorities_go_first_and_min_awake_and_keep_awake_are_honoured() -> None:
    members = (
        member("a-0", priority=5, last_used=NOW - 5000),
        member("b-0", priority=0, last_used=NOW),
        member("c-0", ASLEEP),
    )
    assert dict(decide_pool(pool(*members, asks={"c-0": NOW})).evict) == {"b-0": for_wake("c-0")}
    kept = pool(*members, asks={"c-0": NOW}, models={"b": ModelNeeds(min_awake=1)})
    assert dict(decide_pool(kept).evict) == {"a-0": for_wake("c-0")}
    both = pool(
        *members,
        asks={"c-0": NOW},
        models={"b": ModelNeeds(min_awake=1), "a": ModelNeeds(keep_awake=True)},
    )
    decision = decide_pool(both)
    assert not decision.evict
    assert decision.waiting[0].reason == (
        "no awake member can make room: 2 kept awake by their models (minAwake, desiredState)"
    )


def test_a_wake_that_cannot_be_served_takes_nothing_from_one_that_can() -> None:
    members = (
        member("a-0", busy=True),
        member("b-0", busy=True),
        member("c-0", ASLEEP),
        member("d-0", ASLEEP, footprint=2 * GIB),
    )
    # c asked first and cannot be served while a and b are busy; d fits in the free memory.
    decision = decide_pool(pool(*members, asks={"c-0": NOW - 10, "d-0": NOW - 5}))
    assert decision.grant == {"d-0"}
    [waiting] = decision.waiting
    assert waiting.pod == "c-0" and not waiting.making_room
    assert "2 busy" in waiting.reason


def test_the_finding_one_large_wake_no_longer_stalls_the_pool() -> None:
    # 70 GiB: p (8 GiB, priority 1000) busy, a and b (30 GiB) idle, c (30) and d (60) asleep.
    # d cannot wake while p serves; c could, by putting a to sleep, and is served.
    members = (
        member("p-0", footprint=8 * GIB, priority=1000, busy=True),
        member("a-0", last_used=NOW - 900),
        member("b-0", last_used=NOW - 100),
        member("c-0", ASLEEP),
        member("d-0", ASLEEP, footprint=60 * GIB),
    )
    decision = decide_pool(pool(*members, asks={"d-0": NOW - 10, "c-0": NOW - 5}))
    assert dict(decision.evict) == {"a-0": for_wake("c-0")}
    d, c = decision.waiting
    assert (d.pod, d.making_room, c.pod, c.making_room) == ("d-0", False, "c-0", True)
    # What it says is true: a and b may sleep but free too little; p is busy. Nobody is kept
    # awake by a model here.
    assert d.reason == (
        "not enough room can be made: what may sleep or is going to sleep frees 58GiB of the "
        "59GiB it lacks; the rest is held by 1 busy"
    )


def test_two_pods_of_one_model_the_second_does_not_stall_a_later_wake() -> None:
    # x-0 and x-1 asked together; x-0 takes the free room; x-1 could only make room with its
    # own sibling (never) or the busy y; w, asked later, fits in what is left.
    members = (
        member("y-0", busy=True),
        member("x-0", ASLEEP),
        member("x-1", ASLEEP),
        member("w-0", ASLEEP, footprint=8 * GIB),
    )
    asks = {"x-0": NOW - 10, "x-1": NOW - 10, "w-0": NOW - 5}
    decision = decide_pool(pool(*members, asks=asks))
    assert decision.grant == {"x-0", "w-0"}
    [x1] = decision.waiting
    assert x1.pod == "x-1" and not x1.making_room
    assert "1 busy" in x1.reason and "kept awake" not in x1.reason


def test_a_member_that_passed_a_waiting_wake_gives_its_room_back_once_idle() -> None:
    # c asked at NOW - 100 and could not be served; b's wake, asked later, was; b woke 5 s ago.
    # Now a is idle: c is served, and b is not protected by minResidency from it.
    passed = member("b-0", awake_since=NOW - 5, woken_for=NOW - 50, last_used=NOW - 5)
    view = pool(member("a-0", busy=True), passed, member("c-0", ASLEEP), asks={"c-0": NOW - 100})
    assert dict(decide_pool(view).evict) == {"b-0": for_wake("c-0")}
    # Woken for a wake asked before c's, b keeps its minResidency.
    before = replace(passed, woken_for=NOW - 200)
    decision = decide_pool(replace(view, members=(view.members[0], before, view.members[2])))
    assert not decision.evict and "minResidency" in decision.waiting[0].reason


def test_a_wake_whose_requests_are_gone_keeps_no_place() -> None:
    members = (member("a-0"), member("b-0"), member("c-0", ASLEEP), member("d-0", ASLEEP))
    gone = WakeAsk(pod="c-0", asked_at=NOW - 100, abandoned=True)
    live = WakeAsk(pod="d-0", asked_at=NOW - 5)
    decision = decide_pool(replace(pool(*members), asks=[gone, live]))
    # d, asked later, is served; c puts nobody to sleep and waits for free room.
    assert set(decision.evict.values()) == {for_wake("d-0")}
    c, d = sorted(decision.waiting, key=lambda w: w.pod)
    assert c.abandoned and not c.making_room and d.making_room
    # Alone, it still puts nobody to sleep; with free room, it wakes into it.
    alone = replace(pool(*members), asks=[gone])
    assert not decide_pool(alone).evict and not decide_pool(alone).grant
    roomy = replace(alone, memory=100 * GIB)
    assert decide_pool(roomy).grant == {"c-0"}


def test_a_model_never_evicts_its_own_members_to_wake_another() -> None:
    view = pool(member("a-0"), member("a-1"), member("a-2", ASLEEP), asks={"a-2": NOW})
    decision = decide_pool(view)
    assert not decision.evict
    assert not decision.waiting[0].making_room


def test_a_starting_member_gets_its_room_before_any_wake() -> None:
    view = pool(
        member("a-0", last_used=NOW - 900),
        member("b-0", last_used=NOW - 100),
        member("c-0", MemberState.STARTING),
        member("d-0", ASLEEP, footprint=2 * GIB),
        asks={"d-0": NOW},
    )
    decision = decide_pool(view)
    assert dict(decision.evict) == {"a-0": for_start("c-0")}
    assert not decision.grant  # d waits behind the starting member
    # Its engine cannot load yet: the device holds the two awake and d's residue, not c.
    assert decision.unplaced == {"c-0"}
    assert decision.used == 61 * GIB


def test_three_members_start_on_a_pool_with_room_for_two_one_at_a_time() -> None:
    # a and b awake fill the pool; c, d and e start together. Room is made for c and d now
    # (a and b sleep), e waits; it never took all three at once, which cannot be made.
    starting = [member(f"{p}-0", MemberState.STARTING) for p in "cde"]
    view = pool(member("a-0", last_used=NOW - 900), member("b-0", last_used=NOW - 100), *starting)
    decision = decide_pool(view)
    assert dict(decision.evict) == {"a-0": for_start("c-0"), "b-0": for_start("d-0")}
    assert decision.unplaced == {"c-0", "d-0", "e-0"}
    waits = {w.pod: w for w in decision.waiting}
    assert waits["c-0"].making_room and waits["d-0"].making_room
    assert not waits["e-0"].making_room  # the pool's status counts it as waiting
    # Once c and d have loaded (and are young), e waits for them to age, then gets its room.
    loaded = [replace(m, state=AWAKE, awake_since=NOW) for m in starting[:2]]
    asleep = [member("a-0", ASLEEP), member("b-0", ASLEEP)]
    later = pool(*asleep, *loaded, starting[2])
    assert not decide_pool(later).evict
    assert dict(decide_pool(replace(later, now=NOW + 60)).evict) == {"c-0": for_start("e-0")}


def test_a_wake_is_not_held_back_by_a_start_for_which_no_room_can_be_made() -> None:
    # c (60 GiB) starts but a, which it needs, is busy: w's wake fits in what is free, and c
    # could not take that room (it needs 60 GiB free, the device never has more than 39).
    view = pool(
        member("a-0", busy=True),
        member("c-0", MemberState.STARTING, footprint=60 * GIB),
        member("w-0", ASLEEP, footprint=8 * GIB),
        asks={"w-0": NOW},
    )
    decision = decide_pool(view)
    assert decision.grant == {"w-0"}
    [c] = decision.waiting
    assert c.pod == "c-0" and not c.making_room and "1 busy" in c.reason


def test_a_wake_waits_where_a_starting_member_could_take_its_room() -> None:
    # x-1 starts; only x-0, its own sibling, could make its room: none can be made for it.
    # y's wake could put x-0 to sleep, but the 29 GiB that frees are room x-1 would load into
    # before y wakes (y's wake would run out of memory): y waits too.
    view = pool(
        member("x-0", model="x"),
        member("x-1", MemberState.STARTING, model="x"),
        member("y-0", ASLEEP),
        memory=59 * GIB,
        asks={"y-0": NOW},
    )
    decision = decide_pool(view)
    assert not decision.evict and not decision.grant
    waits = {w.pod: w for w in decision.waiting}
    assert "of its own model" in waits["x-1"].reason
    assert "a starting member" in waits["y-0"].reason


def test_starting_members_take_the_room_there_is_in_pod_order() -> None:
    decision = decide_pool(
        pool(
            member("a-0"),
            member("c-0", MemberState.STARTING),
            member("b-0", MemberState.STARTING),
            member("d-0", MemberState.STARTING, footprint=5 * GIB),
        )
    )
    assert decision.unplaced == {"c-0"}  # b fits beside a; c does not; d (5 GiB) does
    assert decision.used == 65 * GIB


def test_host_memory_sends_the_overflow_to_level_two() -> None:
    view = pool(
        member("a-0", weights=16 * GIB, last_used=NOW - 900),
        member("b-0", weights=16 * GIB, last_used=NOW - 100),
        member("c-0", ASLEEP, weights=16 * GIB),
        host_memory=40 * GIB,
    )
    # c already parks 16 GiB of weights in host RAM; a, first in eviction order, takes the
    # rest; b would not fit.
    assert dict(decide_pool(view).levels) == {"a-0": 1, "b-0": 2}


def test_the_member_chosen_to_make_room_gets_the_host_memory_first() -> None:
    # a is first in eviction order but was woken a moment ago (minResidency): b makes room
    # for c. c's copy takes 16 of the 32 GiB, so one more fits: it goes to b, which sleeps
    # now, not to a, which stays awake.
    view = pool(
        member("a-0", weights=16 * GIB, last_used=NOW - 900, awake_since=NOW - 1),
        member("b-0", weights=16 * GIB, last_used=NOW - 100),
        member("c-0", ASLEEP, weights=16 * GIB),
        asks={"c-0": NOW - 1},
        host_memory=32 * GIB,
    )
    decision = decide_pool(view)
    assert set(decision.evict) == {"b-0"}
    assert dict(decision.levels) == {"a-0": 2, "b-0": 1}


def test_a_member_that_cannot_discard_keeps_its_host_memory_and_the_others_go_to_two() -> None:
    # b's release cannot wake from level 2: it sleeps at level 1 whatever it is told, so its
    # 16 GiB are counted first and a, first in eviction order, is told level 2.
    view = pool(
        member("a-0", weights=16 * GIB, last_used=NOW - 900),
        member("b-0", weights=16 * GIB, last_used=NOW - 100, discards=False),
        host_memory=24 * GIB,
    )
    assert dict(decide_pool(view).levels) == {"a-0": 2, "b-0": 1}


def test_of_two_members_that_cannot_discard_one_sleeps_where_one_copy_fits() -> None:
    # b and c sleep only at level 1, 16 GiB of host RAM each, and hostMemory holds one copy:
    # one of them makes room for a. Counting both copies at once, neither could, and a
    # waited for ever.
    view = pool(
        member("a-0", ASLEEP, level=2),
        member("b-0", weights=16 * GIB, last_used=NOW - 900, discards=False),
        member("c-0", weights=16 * GIB, last_used=NOW - 100, discards=False),
        asks={"a-0": NOW - 5},
        host_memory=16 * GIB,
    )
    decision = decide_pool(view)
    assert dict(decision.evict) == {"b-0": for_wake("a-0")}
    assert decision.levels["b-0"] == 1
    # a needs both to sleep, but only one copy fits: neither is put to sleep in vain, and the
    # wake says why.
    big = replace(view, members=(replace(view.members[0], footprint=60 * GIB), *view.members[1:]))
    decision = decide_pool(big)
    assert not decision.evict and not decision.grant
    assert decision.waiting[0].reason == (
        "not enough room can be made: what may sleep or is going to sleep frees 29GiB of the "
        "50GiB it lacks; the rest is held by 1 that can sleep only at level 1, whose weights "
        "hostMemory cannot hold"
    )


@pytest.mark.parametrize("state", [MemberState.UNKNOWN, MemberState.STARTING, MemberState.WAKING])
def test_a_member_that_cannot_discard_keeps_its_host_memory_before_it_is_awake(
    state: MemberState,
) -> None:
    # b cannot discard and is not awake yet (its server's arguments not read, or it is
    # starting): a, put to sleep now, is told level 2, or its copy would take the only room b
    # will ever have to sleep in.
    view = pool(
        member("a-0", weights=16 * GIB, last_used=NOW - 900),
        member("b-0", state, weights=16 * GIB, discards=False),
        host_memory=16 * GIB,
    )
    assert dict(decide_pool(view).levels) == {"a-0": 2}


def test_a_member_that_cannot_discard_never_sleeps_past_the_host_memory() -> None:
    # Only b could make room for c, but its level-1 sleep would pin 16 GiB in the 8 GiB
    # left: it stays awake, and the wake says why.
    view = pool(
        member("b-0", footprint=50 * GIB, weights=16 * GIB, last_used=NOW - 900, discards=False),
        member("c-0", ASLEEP, level=2, footprint=50 * GIB),
        asks={"c-0": NOW - 5},
        host_memory=8 * GIB,
    )
    decision = decide_pool(view)
    assert not decision.evict and not decision.grant
    assert "whose weights hostMemory cannot hold" in decision.waiting[0].reason
    # With the room, it is put to sleep at level 1.
    roomy = decide_pool(replace(view, host_memory=16 * GIB))
    assert set(roomy.evict) == {"b-0"} and roomy.levels["b-0"] == 1


def test_a_copy_kept_after_a_wake_holds_host_memory_and_costs_nothing_more() -> None:
    # a slept at level 1 before and woke: its process keeps the pinned copy (PyTorch caches
    # it). It sleeps at level 1 again for nothing more; b, with no copy, finds 40 - 16 = 24
    # GiB, enough once; c's 16 GiB would not fit beside both.
    view = pool(
        member("a-0", weights=16 * GIB, host_copy=True, last_used=NOW - 100),
        member("b-0", weights=16 * GIB, last_used=NOW - 900),
        member("c-0", weights=16 * GIB, last_used=NOW - 500),
        host_memory=40 * GIB,
    )
    assert dict(decide_pool(view).levels) == {"a-0": 1, "b-0": 1, "c-0": 2}
    assert host_memory_used(view.members) == 16 * GIB
    # Asleep at level 2 (or asked for level 2), a kept copy still counts.
    kept = member("d-0", ASLEEP, level=2, weights=16 * GIB, host_copy=True)
    assert host_memory_used([kept, member("e-0", ASLEEP, level=2, weights=8 * GIB)]) == 16 * GIB


def test_cheapest_prefers_cheap_wakes_of_long_idle_members() -> None:
    members = [
        member("a-0", wake_seconds=20.0, last_used=NOW - 100),
        member("b-0", wake_seconds=0.3, last_used=NOW - 100),
        member("c-0", wake_seconds=0.3, last_used=NOW - 10),
    ]
    order = [m.pod for m in eviction_order(members, Eviction.CHEAPEST, NOW)]
    assert order == ["b-0", "c-0", "a-0"]
    lru = [m.pod for m in eviction_order(members, Eviction.LEAST_RECENTLY_USED, NOW)]
    assert lru[-1] == "c-0"


def test_cheapest_keeps_a_model_asked_for_in_bursts_over_one_asked_for_once() -> None:
    # Between two of its bursts the popular model has been idle longer than the one asked for
    # once a little later: least recently used, it would be the one put to sleep, and its next
    # burst would wait for a swap back. Cheapest weighs its requests of the last ten minutes.
    members = [
        member("popular-0", last_used=NOW - 90, recent_requests=40),
        member("once-0", last_used=NOW - 60, recent_requests=1),
    ]
    cheapest = [m.pod for m in eviction_order(members, Eviction.CHEAPEST, NOW)]
    assert cheapest == ["once-0", "popular-0"]
    lru = [m.pod for m in eviction_order(members, Eviction.LEAST_RECENTLY_USED, NOW)]
    assert lru == ["popular-0", "once-0"]
    # With nothing in the window the recency term alone orders them.
    quiet = [replace(m, recent_requests=0) for m in members]
    assert [m.pod for m in eviction_order(quiet, Eviction.CHEAPEST, NOW)] == lru


HEADROOM_1 = Headroom(wakes=1, idle_after=60.0)


def test_headroom_puts_the_least_recently_used_idle_member_to_sleep_ahead_of_wakes() -> None:
    view = pool(
        member("a-0", last_used=NOW - 100),
        member("b-0", last_used=NOW - 900),
        member("c-0", ASLEEP),
        member("d-0", ASLEEP),
        headroom=HEADROOM_1,
    )
    decision = decide_pool(view)
    assert dict(decision.evict) == {"b-0": HEADROOM}
    assert not decision.grant and not decision.waiting
    # Without a headroom the pool is lazy: nobody sleeps before a wake asks.
    assert not decide_pool(replace(view, headroom=None)).evict


def test_headroom_does_nothing_while_the_next_wake_fits_or_a_sleep_already_frees_it() -> None:
    fits = pool(member("a-0"), member("c-0", ASLEEP), member("d-0", ASLEEP), headroom=HEADROOM_1)
    assert not decide_pool(fits).evict
    freeing = pool(
        member("a-0"), member("b-0", DRAINING), member("c-0", ASLEEP), headroom=HEADROOM_1
    )
    assert not decide_pool(freeing).evict
    everyone_awake = pool(member("a-0"), member("b-0"), memory=61 * GIB, headroom=HEADROOM_1)
    assert not decide_pool(everyone_awake).evict  # no sleeper, nothing to keep room for


@pytest.mark.parametrize(
    ("spared", "why"),
    [
        ({"last_used": NOW - 30}, "served a request less than idleAfter ago"),
        ({"busy": True}, "busy"),
        ({"awake_since": NOW - 10, "last_used": NOW - 600}, "inside minResidency"),
    ],
)
def test_headroom_spares_recent_busy_and_young_members(spared: dict[str, object], why: str) -> None:
    view = pool(
        member("a-0", **spared),
        member("b-0", last_used=NOW - 30),
        member("c-0", ASLEEP),
        headroom=HEADROOM_1,
    )
    assert not decide_pool(view).evict, why


def test_headroom_honours_min_awake_and_waits_behind_a_waiting_wake() -> None:
    view = pool(
        member("a-0"),
        member("b-0"),
        member("c-0", ASLEEP),
        member("d-0", ASLEEP),
        models={"a": ModelNeeds(min_awake=1)},
        headroom=HEADROOM_1,
    )
    assert dict(decide_pool(view).evict) == {"b-0": HEADROOM}
    asked = replace(view, asks=[WakeAsk(pod="c-0", asked_at=NOW)])
    decision = decide_pool(asked)
    assert dict(decision.evict) == {
        "b-0": for_wake("c-0")
    }  # the wake's own eviction, and nothing more


def test_headroom_for_two_wakes_sleeps_as_many_as_it_takes_or_none() -> None:
    members = [member(f"{m}-0", last_used=NOW - 100 * (i + 1)) for i, m in enumerate("ab")]
    sleepers = [member("c-0", ASLEEP), member("d-0", ASLEEP)]
    two = Headroom(wakes=2, idle_after=60.0)
    decision = decide_pool(pool(*members, *sleepers, headroom=two))
    assert dict(decision.evict) == {"a-0": HEADROOM, "b-0": HEADROOM}
    busy = replace(members[0], busy=True)
    assert not decide_pool(pool(busy, members[1], *sleepers, headroom=two)).evict  # in vain


PRIME_10 = Prime(idle_after=10.0)


def primed(*members: Member, **kw: object) -> PoolView:
    """A pool where two of three fit, with priming on."""
    return pool(*members, prime=PRIME_10, **kw)


def test_prime_sleeps_one_idle_member_that_never_slept_at_level_one() -> None:
    view = primed(
        member("a-0", last_used=NOW - 100),
        member("b-0", last_used=NOW - 900),
        member("c-0", ASLEEP, host_copy=True),
    )
    decision = decide_pool(view)
    # One at a time, the least needed first; at level 1, whatever else the host memory says.
    assert dict(decision.evict) == {"b-0": PRIME}
    assert decision.levels["b-0"] == 1
    assert not decision.grant and not decision.waiting
    assert not decide_pool(replace(view, prime=None)).evict  # off unless the pool asks for it


@pytest.mark.parametrize(
    ("changed", "why"),
    [
        ({"host_copy": True}, "its process holds a pinned copy already"),
        ({"level": 2}, "its model sleeps at level 2 (no copy to pin)"),
        ({"busy": True}, "busy"),
        ({"last_used": NOW - 5}, "served a request less than idleAfter ago"),
        ({"awake_since": NOW - 10}, "inside minResidency"),
    ],
)
def test_prime_spares_members_it_would_not_help_or_that_are_wanted(
    changed: dict[str, object], why: str
) -> None:
    view = primed(member("a-0", **changed), member("c-0", ASLEEP, host_copy=True))
    assert not decide_pool(view).evict, why


def test_prime_waits_for_a_quiet_pool_and_respects_needs_and_host_memory() -> None:
    idle = member("a-0", weights=16 * GIB)
    pinned = member("b-0", host_copy=True, weights=16 * GIB)  # awake, its copy kept
    sleeper = member("c-0", ASLEEP, host_copy=True, weights=16 * GIB)
    assert decide_pool(primed(idle, pinned, sleeper)).evict == {"a-0": PRIME}
    for other, kw, why in (
        (replace(pinned, state=DRAINING), {}, "a sleep under way"),
        (replace(pinned, state=MemberState.WAKING), {}, "a wake under way"),
        (replace(pinned, state=MemberState.STARTING), {}, "a member starting"),
        (pinned, {"asks": {"c-0": NOW - 1000}}, "a wake asked"),
        (pinned, {"models": {"a": ModelNeeds(min_awake=1)}}, "minAwake"),
        (pinned, {"models": {"a": ModelNeeds(keep_awake=True)}}, "desiredState Awake"),
        (pinned, {"memory": 200 * GIB}, "every member fits awake"),
        (pinned, {"host_memory": 47 * GIB}, "no host memory for its copy beside the others'"),
    ):
        decision = decide_pool(primed(idle, other, sleeper, **kw))
        assert PRIME not in decision.evict.values(), why
    assert decide_pool(primed(idle, pinned, sleeper, host_memory=48 * GIB)).evict == {"a-0": PRIME}


def test_a_primed_member_is_woken_back_only_into_free_room_after_every_real_ask() -> None:
    members = [member("a-0"), member("b-0", ASLEEP), member("c-0", ASLEEP)]
    back = WakeAsk(pod="b-0", asked_at=NOW - 50, lazy=True)
    # Room for it: granted, and it never shows as waiting.
    alone = pool(*members, asks=None)
    decision = decide_pool(replace(alone, asks=[back]))
    assert decision.grant == {"b-0"} and not decision.waiting and not decision.evict
    # A real ask, even a later one, takes the room first; the wake back neither waits nor
    # makes anyone sleep.
    real = WakeAsk(pod="c-0", asked_at=NOW)
    decision = decide_pool(replace(alone, asks=[back, real]))
    assert decision.grant == {"c-0"} and not decision.waiting and not decision.evict
    # No room at all: nothing is evicted for it.
    full = pool(member("a-0"), member("d-0"), member("b-0", ASLEEP), asks=None)
    decision = decide_pool(replace(full, asks=[back]))
    assert not decision.grant and not decision.evict and not decision.waiting


def test_overcommitted_says_the_arithmetic() -> None:
    assert overcommitted(70 * GIB, [member("a-0"), member("b-0")]) is None
    message = overcommitted(20 * GIB, [member("a-0", ASLEEP), member("b-0", ASLEEP)])
    assert message is not None and ">" in message and "spec.pool.memory" in message


# ---------------------------------------------------------------------------------------------
# A small world: the decision drives members, who then change as engines would.


@dataclass
class World:
    memory: int
    members: dict[str, Member]
    models: dict[str, ModelNeeds]
    asked: dict[str, float] = field(default_factory=dict)
    now: float = NOW
    granted: list[str] = field(default_factory=list)
    headroom: Headroom | None = None
    eviction: Eviction = Eviction.LEAST_RECENTLY_USED
    host_memory: int | None = None
    wants_level: dict[str, int] = field(default_factory=dict)
    """The level each member's model asks for (a member asleep has the level it sleeps at)."""
    prime: Prime | None = None
    priming: dict[str, float] = field(default_factory=dict)
    """Members put to sleep to prime them: once asleep, woken back by a lazy ask."""
    gone: set[str] = field(default_factory=set)
    """Asks whose requests are all gone (their clients gave up)."""

    def view(self) -> PoolView:
        asks = [WakeAsk(pod=p, asked_at=t, abandoned=p in self.gone) for p, t in self.asked.items()]
        asks += [
            WakeAsk(pod=p, asked_at=t, lazy=True)
            for p, t in self.priming.items()
            if self.members[p].state is ASLEEP
        ]
        return PoolView(
            memory=self.memory,
            host_memory=self.host_memory,
            eviction=self.eviction,
            min_residency=30.0,
            members=tuple(self.members.values()),
            asks=asks,
            models=self.models,
            now=self.now,
            headroom=self.headroom,
            prime=self.prime,
        )

    def used(self) -> int:
        """What the device holds: a starting member nothing until its engine has loaded."""
        return sum(m.held for m in self.members.values() if m.state is not MemberState.STARTING)

    def apply(self, event: tuple[str, int]) -> None:
        kind, index = event
        pods = sorted(self.members)
        pod = pods[index % len(pods)]
        m = self.members[pod]
        if kind == "ask" and m.state is ASLEEP and (pod not in self.asked or pod in self.gone):
            # A new ask, or clients back for one whose requests had all gone: it asks anew.
            self.asked[pod] = self.now
            self.gone.discard(pod)
        elif kind == "leave" and pod in self.asked:
            self.gone.add(pod)
        elif kind == "start" and m.state is ASLEEP and pod not in self.asked:
            # Its pod is replaced: the new engine loads once the device has room for it, and
            # the old process's pinned host memory is gone with it.
            self.members[pod] = replace(
                m,
                state=MemberState.STARTING,
                awake_since=None,
                host_copy=False,
                level=self.wants_level.get(pod, 1),
            )
        elif kind == "busy" and m.state is AWAKE:
            self.members[pod] = replace(m, busy=not m.busy, last_used=self.now)
        elif kind == "confirm":
            # Engines finish what they were doing: a sleep, a wake.
            for name, other in list(self.members.items()):
                if other.state is DRAINING:
                    # A level-1 sleep pinned a copy: the process keeps it from now on.
                    copy = other.host_copy or other.level == 1
                    self.members[name] = replace(other, state=ASLEEP, host_copy=copy)
                elif other.state is MemberState.WAKING:
                    level = self.wants_level.get(name, 1)
                    self.members[name] = replace(
                        other, state=AWAKE, awake_since=self.now, level=level
                    )
            # vLLM loads only when the device's free memory covers its share.
            for name, other in sorted(self.members.items()):
                fits = self.used() + other.footprint <= self.memory
                if other.state is MemberState.STARTING and fits:
                    self.members[name] = replace(other, state=AWAKE, awake_since=self.now)
        elif kind == "tick":
            self.now += 10.0 * (index % 7 + 1)
        elif kind == "nudge":
            self.now += 1.0 + index % 5

    def decide(self) -> None:
        view = self.view()
        decision = decide_pool(view)
        lazy = {a.pod for a in view.asks if a.lazy}
        # Wakes whose requests are gone wait for free room, and hold back nothing else.
        waits = [w for w in decision.waiting if not w.abandoned]
        if decision.grant & lazy:
            # A wake back takes only room nobody waits for, and nobody sleeps for it.
            assert not waits and not decision.evict
        self.priming = {p: t for p, t in self.priming.items() if p not in lazy}
        # What the status reports never exceeds the device, and names exactly the starting
        # members that have no room.
        assert decision.used <= self.memory
        assert decision.unplaced <= {
            p for p, m in self.members.items() if m.state is MemberState.STARTING
        }
        for pod, why in decision.evict.items():
            m = self.members[pod]
            assert m.state is AWAKE and not m.busy  # never a busy member
            if m.awake_since is not None and self.now - m.awake_since < 30.0:
                # Inside minResidency: only for a wake asked before the one it woke for.
                asked = self.asked.get(why.subject)
                assert asked is not None and m.woken_for is not None and m.woken_for > asked
            if why == HEADROOM:
                assert self.headroom is not None and not waits
                assert self.now - m.last_used >= self.headroom.idle_after
            if why == PRIME:
                assert self.prime is not None and not waits and not decision.grant
                assert self.now - m.last_used >= self.prime.idle_after
                assert m.level == 1 and not m.host_copy and len(decision.evict) == 1
                assert decision.levels[pod] == 1
                self.priming[pod] = self.now
            # An engine that cannot discard sleeps at level 1 whatever it is told.
            level = decision.levels.get(pod, m.level) if m.discards else 1
            self.members[pod] = replace(m, state=DRAINING, level=level)
        for pod in decision.grant:
            m = self.members[pod]
            assert m.state is ASLEEP
            self.members[pod] = replace(m, state=MemberState.WAKING, woken_for=self.asked.get(pod))
            self.asked.pop(pod, None)
            self.gone.discard(pod)
            self.granted.append(pod)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    count = draw(st.integers(2, 6))
    members: dict[str, Member] = {}
    wants_level: dict[str, int] = {}
    for i in range(count):
        pod = f"m{i}-0"
        footprint = draw(st.integers(5, 40)) * GIB
        # Some run a release that cannot wake from level 2: whatever is asked, they sleep at
        # level 1 (their loop reports that level to the pool).
        discards = draw(st.sampled_from([True, True, False]))
        wants_level[pod] = draw(st.sampled_from([1, 1, 2])) if discards else 1
        members[pod] = member(
            pod,
            ASLEEP,
            footprint=footprint,
            weights=footprint // 2,
            level=wants_level[pod],
            discards=discards,
            # Asleep at level 1, it holds its copy; at level 2, it may keep one from before.
            host_copy=wants_level[pod] == 1 or draw(st.booleans()),
            priority=draw(st.integers(-1, 1)),
            last_used=NOW - draw(st.integers(0, 1000)),
            recent_requests=draw(st.integers(0, 50)),
            wake_seconds=draw(st.sampled_from([0.3, 20.0])),
        )
    memory = max(m.footprint for m in members.values()) + sum(m.residue for m in members.values())
    memory += draw(st.integers(0, 60)) * GIB
    needs = {f"m{i}": ModelNeeds(min_awake=draw(st.sampled_from([0, 0, 1]))) for i in range(count)}
    headroom = draw(
        st.one_of(
            st.none(),
            st.builds(Headroom, wakes=st.integers(1, 3), idle_after=st.sampled_from([0.0, 30.0])),
        )
    )
    eviction = draw(st.sampled_from(list(Eviction)))
    prime = draw(st.sampled_from([None, Prime(idle_after=10.0)]))
    host_memory = draw(st.one_of(st.none(), st.integers(0, 40)))
    if host_memory is not None:
        host_memory = host_memory_used(members.values()) + host_memory * GIB
    return World(
        memory=memory,
        members=members,
        models=needs,
        headroom=headroom,
        eviction=eviction,
        host_memory=host_memory,
        wants_level=wants_level,
        prime=prime,
    )


EVENTS = st.lists(
    st.tuples(st.sampled_from(["ask", "busy", "confirm", "tick", "start"]), st.integers(0, 20)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(worlds(), EVENTS)
def test_the_device_is_never_overcommitted(world: World, events: list[tuple[str, int]]) -> None:
    assert world.used() <= world.memory
    for event in events:
        world.apply(event)
        world.decide()
        assert world.used() <= world.memory, (event, world.members)


@settings(max_examples=200, deadline=None)
@given(worlds(), EVENTS)
def test_host_memory_is_never_overcommitted(world: World, events: list[tuple[str, int]]) -> None:
    # Pinned copies outlive the wakes: once a member's level-1 sleep made one, its process
    # holds it, awake or asleep at any level, until the member restarts.
    slack = 0 if world.host_memory is None else world.host_memory
    slack -= host_memory_used(world.members.values())
    # Some members start awake, as many as the device holds: every other one of them keeps a
    # copy from an earlier sleep, the others (restarted since) have none.
    for index, (pod, m) in enumerate(sorted(world.members.items())):
        woken = replace(m, state=AWAKE, host_copy=m.host_copy and index % 2 == 0)
        if world.used() - m.held + woken.held <= world.memory:
            world.members[pod] = woken
    world.host_memory = host_memory_used(world.members.values()) + max(slack, 0)
    for event in events:
        world.apply(event)
        world.decide()
        used = host_memory_used(world.members.values())
        assert used <= world.host_memory, (event, world.members)


# Wakes come and go (their clients may leave), members get busy and idle, the clock moves by
# seconds or by minutes; no member starts (the starting members' own rule is tested below).
QUEUE_EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["ask", "ask", "leave", "busy", "confirm", "tick", "nudge"]),
        st.integers(0, 20),
    ),
    max_size=60,
)


def served(view: PoolView, decision: PoolDecision) -> tuple[object, ...]:
    """What the decision gives the wakes that asked: grants, sleeps made for them, and which
    wait while room is made (not what a quiet pool does ahead of need)."""
    eager = {a.pod for a in view.asks if not a.lazy}
    return (
        decision.grant & eager,
        {p: why for p, why in decision.evict.items() if why.promised},
        {w.pod for w in decision.waiting if w.making_room},
    )


# The same, with members that start (their pod replaced) among them.
STARTING_EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["ask", "ask", "leave", "busy", "confirm", "tick", "nudge", "start"]),
        st.integers(0, 20),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(worlds(), STARTING_EVENTS)
def test_a_wake_that_cannot_be_served_holds_back_no_other(
    world: World, events: list[tuple[str, int]]
) -> None:
    # No head-of-line blocking: the wakes that cannot be served now (and those whose requests
    # are gone and find no free room) take nothing; without them the others get the same.
    for event in events:
        world.apply(event)
        view = world.view()
        decision = decide_pool(view)
        stuck = {w.pod for w in decision.waiting if not w.making_room}
        if stuck:
            rest = replace(view, asks=[a for a in view.asks if a.pod not in stuck])
            assert served(rest, decide_pool(rest)) == served(view, decision), (stuck, view)
        for pod in stuck:
            # And each is stuck by itself, not by another that cannot be served either.
            alone = replace(rest, asks=[*rest.asks, *(a for a in view.asks if a.pod == pod)])
            again = {w.pod: w for w in decide_pool(alone).waiting}
            assert pod in again and not again[pod].making_room, (pod, view)
        world.decide()


@settings(max_examples=300, deadline=None)
@given(worlds(), QUEUE_EVENTS)
def test_no_wake_waits_for_wakes_asked_after_it(
    world: World, events: list[tuple[str, int]]
) -> None:
    # No starvation: whatever happened, once nobody is busy and every sleep and wake is done,
    # the earliest live wake is served now, unless a member woken for an earlier wake is
    # still inside minResidency. Members woken since for later wakes do not hold it back.
    world.models = {name: ModelNeeds() for name in world.models}
    for event in events:
        world.apply(event)
        world.decide()
    world.members = {p: replace(m, busy=False) for p, m in world.members.items()}
    world.apply(("confirm", 0))
    view = world.view()
    live = sorted(
        (a for a in view.asks if not a.lazy and not a.abandoned), key=lambda a: (a.asked_at, a.pod)
    )
    if not live:
        return
    first = live[0]
    protected = [
        m
        for m in world.members.values()
        if m.state is AWAKE
        and m.awake_since is not None
        and world.now - m.awake_since < 30.0
        and (m.woken_for is None or m.woken_for <= first.asked_at)
    ]
    if protected:
        return
    decision = decide_pool(view)
    waits = {w.pod: w for w in decision.waiting}
    assert first.pod in decision.grant or waits[first.pod].making_room, (first, world.members)


@settings(max_examples=150, deadline=None)
@given(worlds(), st.lists(st.integers(0, 20), max_size=12))
def test_no_wake_starves_when_members_go_idle(world: World, asks: list[int]) -> None:
    # Every member that asks is woken in the end, as long as nobody stays busy: the clock
    # moves past minResidency, sleeps are confirmed, and the queue drains in order.
    world.models = {name: ModelNeeds() for name in world.models}
    for index in asks:
        world.apply(("ask", index))
    for _ in range(4 * len(world.members) + 4):
        world.decide()
        world.apply(("confirm", 0))
        world.apply(("tick", 6))  # 70 s: past minResidency
    assert not world.asked, (world.asked, world.members)


@settings(max_examples=200, deadline=None)
@given(worlds(), st.sets(st.integers(0, 5), min_size=1))
def test_starting_members_all_load_in_the_end(world: World, starting: set[int]) -> None:
    # Progress from any set of starting members: some members awake (as many as fit), then any
    # of them, awake or asleep, start at once (their pods replaced). As long as nobody is busy
    # and the clock moves, room is made for each in turn until every one has loaded.
    world.models = {name: ModelNeeds() for name in world.models}
    world.headroom, world.prime = None, None
    for pod, m in sorted(world.members.items()):
        woken = replace(m, state=AWAKE, awake_since=None)
        if world.used() - m.held + woken.held <= world.memory:
            world.members[pod] = woken
    pods = sorted(world.members)
    for index in starting:
        pod = pods[index % len(pods)]
        world.members[pod] = replace(
            world.members[pod], state=MemberState.STARTING, awake_since=None, host_copy=False
        )
    for _ in range(4 * len(pods) + 4):
        world.decide()
        assert world.used() <= world.memory
        world.apply(("confirm", 0))
        world.apply(("tick", 6))  # 70 s: past minResidency
    assert not [p for p, m in world.members.items() if m.state is MemberState.STARTING]


# No member starting: a member that starts takes its room before any wake, and while the
# device cannot hold it beside the others the pool keeps making room for it, so never settles.
SETTLING = st.lists(
    st.tuples(st.sampled_from(["ask", "busy", "confirm", "tick"]), st.integers(0, 20)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(worlds(), SETTLING, st.integers(0, 20))
def test_with_headroom_a_settled_pool_grants_the_next_wake_at_once(
    world: World, events: list[tuple[str, int]], asker: int
) -> None:
    # Whatever happened before: once members are idle past idleAfter and minResidency and the
    # sleeps under way are confirmed, any sleeping member's wake is granted when it asks.
    world.models = {name: ModelNeeds() for name in world.models}
    world.headroom = Headroom(wakes=1, idle_after=30.0)
    for event in events:
        world.apply(event)
        world.decide()
    world.asked.clear()
    world.members = {p: replace(m, busy=False) for p, m in world.members.items()}
    for _ in range(3):
        world.apply(("confirm", 0))
        world.apply(("tick", 6))  # 70 s: past idleAfter and minResidency
        world.decide()
    world.apply(("confirm", 0))
    world.asked.clear()
    sleepers = sorted(p for p, m in world.members.items() if m.state is ASLEEP)
    if not sleepers:
        return
    pod = sleepers[asker % len(sleepers)]
    world.asked[pod] = world.now
    assert decide_pool(world.view()).grant == {pod}, world.members


@settings(max_examples=150, deadline=None)
@given(worlds())
def test_prime_pins_every_awake_member_once_and_wakes_it_back(world: World) -> None:
    # Members start awake with no copy, as many as fit; nobody asks for anything. One at a
    # time, each is put to sleep at level 1 and woken back into its own room: in the end every
    # one of them holds its copy and is awake again, and the device was never over-committed.
    world.prime = Prime(idle_after=10.0)
    world.headroom, world.host_memory = None, None
    world.models = {name: ModelNeeds() for name in world.models}
    started: list[str] = []
    for pod, m in sorted(world.members.items()):
        woken = replace(m, state=AWAKE, host_copy=False, level=1, awake_since=None)
        world.wants_level[pod] = 1
        if world.used() - m.held + woken.held <= world.memory:
            world.members[pod] = woken
            started.append(pod)
    if sum(m.footprint for m in world.members.values()) <= world.memory:
        return  # every member fits awake: nothing will ever need a fast sleep
    for _ in range(3 * len(started) + 2):
        world.decide()
        assert world.used() <= world.memory
        world.apply(("confirm", 0))
        world.apply(("tick", 0))  # 10 s: idle long enough, again
    for pod in started:
        m = world.members[pod]
        assert m.host_copy and m.state is AWAKE, (pod, world.members)


@pytest.mark.parametrize("eviction", list(Eviction))
def test_eviction_order_is_total(eviction: Eviction) -> None:
    twins = [member("a-0"), member("b-0")]
    assert [m.pod for m in eviction_order(twins, eviction, NOW)] == ["a-0", "b-0"]
