"""A GPU pool's books (policy/pool/books.py): tables of what they remember and forget between two
decisions, and properties over random runs of a small pool whose members ask, sleep, wake and
start while the books follow them, as the operator's pool loop and whatif's replay both do."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snooze.api.gpupool import Eviction
from snooze.api.reasons import FailureReason
from snooze.policy.pool.books import Blame, PoolBooks
from snooze.policy.pool.decision import (
    BOOKS,
    HEADROOM,
    PRIME,
    Member,
    MemberState,
    PoolDecision,
    PoolView,
    Prime,
    RoomFor,
    RoomKind,
    WakeAsk,
    decide_pool,
)
from snooze.policy.runs import Process

GIB = 2**30
AWAKE, ASLEEP, DRAINING = MemberState.AWAKE, MemberState.ASLEEP, MemberState.DRAINING


def member(pod: str, state: MemberState = AWAKE, **kw: object) -> Member:
    args: dict[str, object] = {
        "pod": pod,
        "model": pod.split("-")[0],
        "state": state,
        "footprint": 30 * GIB,
        "residue": 1 * GIB,
        "last_used": 0.0,
        "awake_since": 0.0,
    }
    return Member(**(args | kw))  # type: ignore[arg-type]


def decision(
    *,
    grant: frozenset[str] = frozenset(),
    evict: dict[str, RoomFor] | None = None,
    levels: dict[str, int] | None = None,
) -> PoolDecision:
    return PoolDecision(grant=grant, evict=evict or {}, levels=levels or {}, waiting=(), used=0)


def test_an_ask_keeps_its_place_until_its_model_withdraws_it() -> None:
    books = PoolBooks()
    assert books.ask("m", ["m-0"], 1.0)
    assert books.ask("m", ["m-0", "m-1"], 2.0)
    assert not books.ask("m", ["m-1", "m-0"], 3.0)  # nothing new: no poke
    assert books.ask("n", ["n-0"], 4.0)
    assert {p: a.at for p, a in books.asks.items()} == {"m-0": 1.0, "m-1": 2.0, "n-0": 4.0}
    assert books.ask("m", ["m-1"], 5.0)  # m-0 withdrawn; n's ask is n's
    assert {p: a.at for p, a in books.asks.items()} == {"m-1": 2.0, "n-0": 4.0}


def test_the_asks_of_members_gone_from_the_pool_lapse() -> None:
    books = PoolBooks()
    books.ask("m", ["m-0", "m-1"], 1.0)
    followed = books.follow([member("m-1", ASLEEP)], now=2.0)
    assert [a.pod for a in followed.asks] == ["m-1"] and set(books.asks) == {"m-1"}


@pytest.mark.parametrize(
    ("held", "abandoned", "at"),
    [
        ([None, None], False, 1.0),  # the gateway's counters unknown: nothing changes
        ([0, 0], False, 1.0),  # asked by hand (kubectl annotate): no request ever held
        ([2, 1], False, 1.0),  # requests held for it all along
        ([2, 0], True, 1.0),  # their clients gave up: it keeps no place
        ([2, 0, 1], False, 12.0),  # a new request: asked anew, behind the wakes since
    ],
)
def test_an_ask_follows_the_requests_the_gateway_holds_for_it(
    held: list[int | None], abandoned: bool, at: float
) -> None:
    books = PoolBooks()
    books.ask("m", ["m-0"], 1.0)
    followed = None
    for i, count in enumerate(held):
        followed = books.follow(
            [member("m-0", ASLEEP)], now=10.0 + i, held=lambda model, c=count: c
        )
    assert followed is not None
    [ask] = followed.asks
    assert (ask.abandoned, ask.asked_at) == (abandoned, at)


@pytest.mark.parametrize(
    ("room", "promised", "headroom"),
    [
        (RoomFor(RoomKind.WAKE, "c-0"), True, False),
        (RoomFor(RoomKind.START, "s-0"), True, False),
        (BOOKS, True, False),
        (HEADROOM, False, True),
        (PRIME, False, True),
    ],
)
def test_a_sleep_makes_room_for_what_it_was_chosen_for_even_once_the_decision_moved_on(
    room: RoomFor, promised: bool, headroom: bool
) -> None:
    books = PoolBooks()
    present = {"a-0", "c-0", "s-0"}
    books.decided(decision(evict={"a-0": room}), present=present)
    told = books.directive("a-0")
    assert (told.evict, told.headroom, told.promised) == (True, headroom, False)
    books.decided(decision(), present=present)  # a starting member it made room for loads
    assert books.made_room("a-0") == room
    assert books.evictions == 1
    # Its drain, under way, is promised to a wake or a start: a request must not cancel it.
    assert books.directive("a-0").promised is promised
    # Confirmed asleep: the promise ends with the sleep.
    books.follow([member("a-0", ASLEEP)], now=1.0)
    assert not books.directive("a-0").promised


def test_a_sleep_nobody_chose_counts_as_making_room_for_a_wake() -> None:
    books = PoolBooks()
    assert books.made_room("a-0") == RoomFor(RoomKind.WAKE)
    assert books.directive("a-0") == books.directive("nobody")  # no decision yet: nothing


def test_a_new_choice_is_announced_once_while_it_stands() -> None:
    books = PoolBooks()
    chosen = decision(evict={"a-0": HEADROOM})
    assert books.decided(chosen, present={"a-0"}).chosen == [("a-0", HEADROOM)]
    assert books.decided(chosen, present={"a-0"}).chosen == []
    books.decided(decision(), present={"a-0"})
    assert books.decided(chosen, present={"a-0"}).chosen == [("a-0", HEADROOM)]


def test_a_grant_remembers_its_ask_until_the_member_sleeps_again() -> None:
    books = PoolBooks()
    books.ask("c", ["c-0"], 11.0)
    decided = books.decided(decision(grant=frozenset({"c-0"})), present={"c-0"})
    assert [(g.pod, g.model, g.asked_at) for g in decided.granted] == [("c-0", "c", 11.0)]
    # Granted again while its wake has not begun: not a new grant.
    assert not books.decided(decision(grant=frozenset({"c-0"})), present={"c-0"}).granted
    books.ask("c", [], 12.0)  # its loop starts the wake
    woke = books.follow([member("c-0", AWAKE)], now=13.0)
    assert woke.members[0].woken_for == 11.0  # it passed every wake asked before 11.0
    books.decided(decision(), present={"c-0"})
    slept = books.follow([member("c-0", ASLEEP)], now=20.0)
    assert slept.members[0].woken_for is None and not books.woken_for


def test_the_members_whose_grant_eviction_or_level_changed_are_told() -> None:
    books = PoolBooks()
    present = {"a-0", "b-0", "c-0"}
    first = books.decided(decision(evict={"a-0": HEADROOM}), present=present)
    assert first.changed(present) == present  # the first decision: everyone looks
    again = books.decided(
        decision(evict={"a-0": HEADROOM}, levels={"b-0": 2}, grant=frozenset({"c-0"})),
        present=present,
    )
    assert again.changed(present) == {"b-0", "c-0"}


def test_a_primed_member_is_woken_back_unless_its_model_asks_or_its_room_goes() -> None:
    books = PoolBooks()
    present = {"a-0"}
    books.decided(decision(evict={"a-0": PRIME}, levels={"a-0": 1}), present=present)
    books.made_room("a-0")
    assert books.primed() == {"a-0"}
    draining = books.follow([member("a-0", DRAINING)], now=1.0)
    assert not any(a.lazy for a in draining.asks)
    asleep = books.follow([member("a-0", ASLEEP)], now=2.0)
    assert [(a.pod, a.lazy) for a in asleep.asks] == [("a-0", True)]
    books.decided(decision(grant=frozenset({"a-0"})), present=present)
    assert books.directive("a-0").rewake
    # Its room went to a wake asked meanwhile: it sleeps on, and is no longer offered it.
    books.decided(decision(), present=present)
    assert not books.follow([member("a-0", ASLEEP)], now=3.0).asks and not books.primed()


def test_a_primed_member_its_model_asks_for_wakes_as_any_ask() -> None:
    books = PoolBooks.restored(evictions=4, copies={}, primed=["a-0"], since=0.0)
    assert books.evictions == 4 and books.primed() == {"a-0"}
    books.follow([member("a-0", ASLEEP)], now=1.0)
    books.ask("a", ["a-0"], 2.0)
    followed = books.follow([member("a-0", ASLEEP)], now=3.0)
    assert [(a.pod, a.lazy) for a in followed.asks] == [("a-0", False)]


def test_a_host_copy_is_forgotten_only_when_its_engine_is_seen_without_it() -> None:
    run = Process("uid-a", 2)
    books = PoolBooks.restored(evictions=0, copies={"a-0": run}, primed=[], since=0.0)
    books.follow([], now=1.0, processes={})  # a-0 missing from one round: kept
    assert books.copies == {"a-0": run}
    books.follow([member("a-0", host_copy=True)], now=2.0, processes={"a-0": run})
    assert books.copies == {"a-0": run}
    books.follow([member("a-0")], now=3.0, processes={"a-0": Process("uid-a", 3)})
    assert books.copies == {}


def judged() -> PoolBooks:
    """Books that judge whom the pool trusts, as the operator's are (whatif's judge nobody)."""
    return PoolBooks.restored(evictions=0, copies={}, primed=[], since=0.0)


def sleep_for_c(books: PoolBooks) -> tuple[list[Member], dict[str, Process]]:
    """a sleeps for c's wake; c is granted, and its wake runs out of memory."""
    runs = {p: Process(f"uid-{p}", 0) for p in ("a-0", "b-0", "c-0")}
    books.ask("c", ["c-0"], 1.0)
    members = [member("a-0"), member("b-0"), member("c-0", ASLEEP)]
    books.follow(members, now=1.0, processes=runs)
    present = {m.pod for m in members}
    books.decided(decision(evict={"a-0": RoomFor(RoomKind.WAKE, "c-0")}), present=present)
    books.made_room("a-0")
    members[0] = member("a-0", DRAINING)
    books.follow(members, now=2.0, processes=runs)
    members[0] = member("a-0", ASLEEP)
    books.follow(members, now=3.0, processes=runs)
    books.decided(decision(grant=frozenset({"c-0"})), present=present)
    return members, runs


@pytest.mark.parametrize("restarts", [False, True])
def test_a_wake_out_of_memory_is_blamed_on_the_sleep_that_made_its_room(restarts: bool) -> None:
    books = judged()
    members, runs = sleep_for_c(books)
    followed = books.follow(
        members,
        now=4.0,
        processes=runs,
        failures={"c-0": 3.5},
        restart_on_failure={"a-0"} if restarts else set(),
    )
    assert followed.blamed == [Blame(pod="a-0", failed="c-0", made_room=True, restart=restarts)]
    whole = {m.pod: m.residue for m in followed.members}
    assert whole["a-0"] == 30 * GIB and whole["b-0"] == GIB  # a counts whole, asleep too
    assert books.directive("a-0").restart is restarts
    assert books.untrusted(followed.members) == {"a-0"}
    # Judged once: the same failure says nothing more.
    again = books.follow(members, now=5.0, processes=runs, failures={"c-0": 3.5})
    assert not again.blamed
    # A new run of a's engine holds nothing of the old one's: trusted again.
    fresh = {**runs, "a-0": Process("uid-a-0", 1)}
    cleared = books.follow(members, now=6.0, processes=fresh, failures={"c-0": 3.5})
    assert books.untrusted(cleared.members) == set()


def test_a_member_asleep_unasked_counts_whole_and_is_told_once() -> None:
    books = judged()
    members = [member("l-0", ASLEEP), member("b-0")]
    runs = {p: Process(p, 0) for p in ("l-0", "b-0")}
    first = books.follow(members, now=1.0, processes=runs, unasked={"l-0"})
    assert first.unasked == ["l-0"] and first.members[0].residue == 30 * GIB
    second = books.follow(members, now=2.0, processes=runs, unasked={"l-0"})
    assert second.unasked == [] and books.untrusted(second.members) == {"l-0"}
    awake = books.follow([member("l-0"), members[1]], now=3.0, processes=runs, unasked=set())
    assert books.untrusted(awake.members) == set()


def test_a_failure_out_of_memory_has_its_reason_word() -> None:
    assert FailureReason.OUT_OF_MEMORY == "OutOfMemory"


# -- properties over random runs ---------------------------------------------------------------


@dataclass
class Pool:
    """Members on a 70 GiB device (two fit awake) whose model loops act on the books'
    directives as the operator's do; the books are the only memory of the pool."""

    members: dict[str, Member]
    prime: Prime | None
    books: PoolBooks = field(default_factory=PoolBooks)
    now: float = 1_000.0
    made: int = 0
    """Sleeps begun to make room (made_room calls)."""

    def view(self) -> tuple[PoolView, list[Member]]:
        followed = self.books.follow(list(self.members.values()), now=self.now)
        self.check_followed(followed.members, followed.asks)
        view = PoolView(
            memory=70 * GIB,
            host_memory=None,
            eviction=Eviction.LEAST_RECENTLY_USED,
            min_residency=30.0,
            members=followed.members,
            asks=followed.asks,
            now=self.now,
            prime=self.prime,
        )
        return view, followed.members

    def check_followed(self, members: list[Member], asks: list[WakeAsk]) -> None:
        books, states = self.books, {m.pod: m.state for m in members}
        # Nothing is remembered of a member that is not there, or of a state it left.
        assert set(books.asks) <= set(states)
        assert all(states[p] is DRAINING for p in books.sleeping_for)
        assert all(states[p] is ASLEEP and p not in books.asks for p in books.priming)
        for pod in books.woken_for:
            assert pod in states and (states[pod] is not ASLEEP or pod in books.granted)
        # A lazy ask is a primed member's wake back, and only that.
        assert {a.pod for a in asks if a.lazy} == books.priming
        assert books.evictions == self.made

    def round(self) -> None:
        view, _ = self.view()
        decided = self.books.decided(decide_pool(view), present=set(self.members))
        assert self.books.priming <= self.books.granted
        for grant in decided.granted:
            assert self.books.woken_for[grant.pod] == grant.asked_at
        self.act()

    def act(self) -> None:
        """Each member's loop does what the pool told it."""
        for pod, m in list(self.members.items()):
            told = self.books.directive(pod)
            if told.evict and m.state is AWAKE:
                room = self.books.made_room(pod)
                self.made += 1
                assert told.headroom is not room.promised
                assert self.books.directive(pod).promised is room.promised
                self.members[pod] = replace(m, state=DRAINING)
            elif told.grant and m.state is ASLEEP:
                self.books.ask(m.model, [], self.now)  # the wake begins: the ask withdrawn
                self.members[pod] = replace(m, state=MemberState.WAKING)

    def apply(self, event: tuple[str, int]) -> None:
        kind, index = event
        pod = sorted(self.members)[index % len(self.members)]
        m = self.members[pod]
        if kind == "ask" and m.state is ASLEEP:
            self.books.ask(m.model, [pod], self.now)
        elif kind == "withdraw":
            self.books.ask(m.model, [], self.now)
        elif kind == "confirm":
            for name, other in list(self.members.items()):
                if other.state is DRAINING:
                    self.members[name] = replace(other, state=ASLEEP, host_copy=True)
                elif other.state is MemberState.WAKING:
                    self.members[name] = replace(other, state=AWAKE, awake_since=self.now)
        elif kind == "leave" and m.state is ASLEEP:
            del self.members[pod]  # its pod is deleted (scaled to zero)
        elif kind == "tick":
            self.now += 10.0 * (index % 7 + 1)


@st.composite
def pools(draw: st.DrawFn) -> Pool:
    count = draw(st.integers(3, 5))
    # Names are data: a model may be called like a word the pool uses for itself.
    names = draw(
        st.lists(
            st.sampled_from(["m", "prime", "headroom", "wake", "start", "books", "x"]),
            min_size=count,
            max_size=count,
            unique=True,
        )
    )
    members = {
        f"{name}-0": member(f"{name}-0", ASLEEP if i >= 2 else AWAKE, host_copy=i % 2 == 0)
        for i, name in enumerate(names)
    }
    prime = draw(st.sampled_from([None, Prime(idle_after=10.0)]))
    return Pool(members=members, prime=prime)


EVENTS = st.lists(
    st.tuples(st.sampled_from(["ask", "withdraw", "confirm", "tick", "leave"]), st.integers(0, 9)),
    max_size=50,
)


@settings(max_examples=200, deadline=None)
@given(pools(), EVENTS)
def test_the_books_remember_only_what_stands(pool: Pool, events: list[tuple[str, int]]) -> None:
    """Whatever the members do, the books forget what became stale (asks of members gone,
    sleeps confirmed, primes woken or taken, wakes passed by members asleep again), count
    every sleep that made room, and tell each member what its drain is for."""
    for event in events:
        pool.apply(event)
        if pool.members:
            pool.round()


@settings(max_examples=100, deadline=None)
@given(pools(), EVENTS)
def test_every_ask_is_granted_once_the_pool_is_left_to_settle(
    pool: Pool, events: list[tuple[str, int]]
) -> None:
    """With the books between the decisions, no wake waits for ever: once the members stop
    asking and the clock moves past minResidency, every live ask is granted."""
    for event in events:
        pool.apply(event)
        if pool.members:
            pool.round()
    for _ in range(20):
        if not pool.members:
            break
        pool.round()
        pool.apply(("confirm", 0))
        pool.apply(("tick", 6))
    assert not pool.books.asks or not pool.members
