"""A GPU pool's books: everything its coordinator remembers from one decision to the next (the
wakes asked and their places, what each sleep makes room for, the grants, the primes, whom a
wake passed, whose sleeps it no longer trusts), in one pure structure that the operator's pool
loop and whatif's replay both keep. The decision itself (policy/pool/decision.py) remembers nothing.

One decision's round: `follow` the members as they are now (it lapses what they made stale, and
gives the members and the asks to decide on), `decide_pool`, then `decided`; between rounds,
the members' model loops `ask`, begin sleeps (`made_room`) and read their `directive`.
Pure: no I/O and no clock; every time is given.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from snooze.policy.pool.trust import Disagreement, Trust
from snooze.policy.pool.types import (
    PRIME,
    Member,
    MemberState,
    PoolDecision,
    RoomFor,
    RoomKind,
    Waiting,
    WakeAsk,
)
from snooze.policy.runs import Process

__all__ = [
    "Asked",
    "Blame",
    "Decided",
    "Directive",
    "Followed",
    "Grant",
    "PoolBooks",
]


@dataclass(kw_only=True)
class Asked:
    """One member's ask for room, as the pool follows it."""

    model: str
    at: float
    """When it asked, or when requests came back for it after all had gone: its place."""
    clients: bool = False
    """The gateway was seen holding requests for its model while it asked."""
    gone: bool = False
    """...and holds none any more: the requests it was asked for all ended (their clients
    gave up, or another pod of the model served them). It keeps no place in the queue."""

    def follow(self, held: int | None, now: float) -> None:
        """What the gateway holds for its model now (None: unknown, nothing changes)."""
        if held is None:
            return
        if held > 0:
            if self.gone:
                self.at, self.gone = now, False  # asked anew: behind those who waited
            self.clients = True
        elif self.clients:
            self.gone = True


class Directive(NamedTuple):
    """What a pool says of one member now (a tuple: whatif asks for one per member at every
    decision)."""

    grant: bool = False
    evict: bool = False
    headroom: bool = False
    """Its sleep only keeps room ahead of wakes, or primes it: a request may still cancel it."""
    rewake: bool = False
    """It slept only to pin its host copy, and the pool has room to wake it back now."""
    promised: bool = False
    """Its sleep under way makes room for a wake or a starting member: a request for it must
    not cancel the drain (the decision lists only awake members, so `evict` says nothing of a
    member already draining)."""
    level: int | None = None
    """The level to sleep at if it sleeps now (None: the model's own)."""
    restart: bool = False
    """Its sleep did not give the device its memory back, and its model's remedy for a failed
    engine is a restart (wake.onFailure: Restart): its pod is deleted."""


@dataclass(frozen=True, kw_only=True)
class Blame:
    """A member whose sleep a wake out of memory showed not to free its memory."""

    pod: str | None
    """None: no member asleep can be blamed (something outside the pool holds memory on its
    device)."""
    failed: str
    """The member whose wake ran out of memory."""
    made_room: bool
    """Its sleep made the room for that wake (else: the likeliest, see Trust.suspects_of)."""
    restart: bool
    """Its model's remedy is a restart, and its sleep made that very room: its pod goes."""


@dataclass(frozen=True, kw_only=True)
class Followed:
    """The members and asks to decide on now, and what the books learnt on the way."""

    members: list[Member]
    """As the books know them: when the wake that woke each was asked, and the members not
    trusted to free their memory counted whole."""
    asks: list[WakeAsk]
    """Every live ask, then the wakes back of primed members (lazy)."""
    blamed: list[Blame] = field(default_factory=list)
    """For each wake newly found out of memory where the books had room, whom it is blamed
    on, in order."""
    unasked: list[str] = field(default_factory=list)
    """Members newly found asleep though the pool never saw them put to sleep."""


@dataclass(frozen=True, kw_only=True)
class Grant:
    """A wake newly granted to what its member's model asked."""

    pod: str
    model: str
    asked_at: float


@dataclass(frozen=True, kw_only=True)
class Decided:
    """What a new decision changed in the books."""

    after: PoolDecision
    chosen: list[tuple[str, RoomFor]]
    """Members newly chosen to sleep, with what for."""
    granted: list[Grant]
    """Wakes newly granted to an ask (not the wakes back of primed members)."""
    before: PoolDecision | None
    """The decision it follows."""

    def changed(self, present: Iterable[str]) -> set[str]:
        """The members whose grant, eviction or level changed, and those that wait: their
        model loops look again now."""
        before, after = self.before, self.after
        found = {
            pod
            for pod in present
            if before is None
            or (pod in before.grant) != (pod in after.grant)
            or (pod in before.evict) != (pod in after.evict)
            or before.levels.get(pod) != after.levels.get(pod)
        }
        return found | {w.pod for w in after.waiting}


@dataclass(kw_only=True)
class PoolBooks:
    """Everything one pool's coordinator remembers between decisions."""

    asks: dict[str, Asked] = field(default_factory=dict)
    """Member -> its ask for room."""
    decision: PoolDecision | None = None
    """The decision that stands."""
    granted: frozenset[str] = frozenset()
    """Its grants: a grant stands, and its ask keeps its place in the queue, until the
    member's own loop starts the wake and withdraws the ask."""
    woken_for: dict[str, float] = field(default_factory=dict)
    """Member -> when the ask it was granted was made, until it sleeps again: the members it
    passed while they waited may take its room back (policy/pool/decision.py)."""
    chosen: dict[str, RoomFor] = field(default_factory=dict)
    """Member -> what it was last chosen to make room for: its sleep may begin after the
    decision has moved on (a starting member it made room for is loading by then)."""
    announced: set[str] = field(default_factory=set)
    """Members whose choice to sleep was announced (Decided.chosen), while it stands."""
    sleeping_for: dict[str, RoomFor] = field(default_factory=dict)
    """Member -> what its sleep under way makes room for (from made_room until it is seen
    asleep): the decision lists only awake members, and a request for one whose drain makes
    room for a wake must not cancel that drain."""
    priming: set[str] = field(default_factory=set)
    """Members whose priming sleep ended asleep: each is woken back into its own room if that
    is still free (a lazy ask)."""
    evictions: int = 0
    """Members put to sleep to make room, since the pool was created."""
    trust: Trust | None = None
    """Whose sleeps the pool no longer trusts to free their memory (None: not judged, as in
    whatif, where every engine frees what it says)."""
    restart: set[str] = field(default_factory=set)
    """Untrusted members whose model's remedy is a restart: their pods are deleted."""
    unasked: set[str] = field(default_factory=set)
    """Members that say they sleep though the pool never saw them put to sleep: counted at
    their whole footprint until seen awake."""
    processes: dict[str, Process] = field(default_factory=dict)
    """Member -> its engine's run: which one a host copy or a distrust speaks of."""
    copies: dict[str, Process] = field(default_factory=dict)
    """Member -> the engine run known to keep a host copy. A member missing from one round
    (its loop restarted, its pod not seen for a moment) keeps its entry: the copy is forgotten
    only when its engine is seen without it."""

    @classmethod
    def restored(
        cls, *, evictions: int, copies: Mapping[str, Process], primed: Iterable[str], since: float
    ) -> PoolBooks:
        """The books as a pool's status kept them, for an operator that starts: its evictions,
        the host copies, and the members it was priming (those asleep are woken back)."""
        return cls(
            evictions=evictions,
            copies=dict(copies),
            sleeping_for=dict.fromkeys(primed, PRIME),
            trust=Trust(since=since),
        )

    # -- what the members' model loops do between decisions ------------------------------

    def ask(self, model: str, pods: Iterable[str], now: float) -> bool:
        """The model's members that want room now (the others of the model withdraw); whether
        that changed anything."""
        wanted = set(pods)
        before = {p for p, a in self.asks.items() if a.model == model}
        for pod in before - wanted:
            del self.asks[pod]
        for pod in wanted - before:
            self.asks[pod] = Asked(model=model, at=now)
        return wanted != before

    def made_room(self, pod: str) -> RoomFor:
        """A member's sleep to make room has begun: counted, and what it makes room for (what
        it was chosen for, even if the decision has moved on since)."""
        room = self.chosen.pop(pod, None) or RoomFor(RoomKind.WAKE)
        self.sleeping_for[pod] = room
        self.evictions += 1
        return room

    def directive(self, pod: str) -> Directive:
        decision = self.decision
        if decision is None:
            return Directive()
        evict = decision.evict.get(pod)
        underway = self.sleeping_for.get(pod)
        return Directive(
            grant=pod in decision.grant,
            evict=evict is not None,
            headroom=evict is not None and not evict.promised,
            promised=underway is not None and underway.promised,
            rewake=pod in decision.grant and pod in self.priming,
            level=decision.levels.get(pod),
            restart=pod in self.restart and self.trust is not None and pod in self.trust.untrusted,
        )

    def waiting_for(self, pods: Iterable[str]) -> Waiting | None:
        """Why one of these members waits, if one does."""
        if self.decision is None:
            return None
        names = set(pods)
        return next((w for w in self.decision.waiting if w.pod in names), None)

    def primed(self) -> set[str]:
        """Members asleep, or going to sleep, for the pool's prime."""
        return self.priming | {p for p, f in self.sleeping_for.items() if f == PRIME}

    # -- a decision's round ----------------------------------------------------------------

    def follow(
        self,
        members: Sequence[Member],
        *,
        now: float,
        held: Callable[[str], int | None] | None = None,
        processes: Mapping[str, Process] | None = None,
        failures: Mapping[str, float] | None = None,
        unasked: Collection[str] = (),
        restart_on_failure: Collection[str] = (),
    ) -> Followed:
        """The members as they are now, and what the books make of them. `held`: requests the
        gateway holds for a model's wake now (None: unknown); `processes`: each member's
        engine run; `failures`: member -> when its last wake ran out of memory; `unasked`:
        members asleep with no mark of a sleep of Snooze's; `restart_on_failure`: members
        whose model's remedy for a failed engine is a restart."""
        present = {m.pod for m in members}
        if processes is not None:
            self.processes = dict(processes)
            for m in members:
                if m.host_copy:
                    self.copies[m.pod] = self.processes[m.pod]
                else:
                    self.copies.pop(m.pod, None)  # seen without one: a new engine run
        # Asks of members that left the pool lapse; the others follow their requests.
        for pod in [p for p in self.asks if p not in present]:
            del self.asks[pod]
        if held is not None:
            for asked in self.asks.values():
                asked.follow(held(asked.model), now)
        if self.trust is not None:
            self.trust.follow(members, self.sleeping_for)
        listed = self._follow_wakes(members, present)
        blamed: list[Blame] = []
        told: list[str] = []
        if self.trust is not None:
            for found in self.trust.judge(listed, failures or {}):
                blamed += self._blame(found, restart_on_failure)
            listed, told = self._follow_trust(listed, set(unasked))
        lazy = self._follow_sleeps(listed)
        asks = [WakeAsk(pod=p, asked_at=a.at, abandoned=a.gone) for p, a in self.asks.items()]
        return Followed(members=listed, asks=asks + lazy, blamed=blamed, unasked=told)

    def decided(self, decision: PoolDecision, present: Collection[str]) -> Decided:
        """A new decision stands; `present`: the members it was taken over."""
        before = self.decision
        self.decision = decision
        # A wake back not granted lost its room to a wake that asked meanwhile: the member
        # sleeps on, with its copy pinned, as any sleeping member, until it is asked for.
        self.priming &= decision.grant
        # (Each step is skipped when it has nothing to do: whatif decides after every event.)
        if self.chosen:
            self.chosen = {p: f for p, f in self.chosen.items() if p in present}
        chosen = []
        if decision.evict or self.announced:
            self.chosen.update(decision.evict)
            chosen = [(p, f) for p, f in decision.evict.items() if p not in self.announced]
            self.announced = set(decision.evict)
        granted = []
        for pod in sorted(decision.grant - self.granted) if decision.grant else ():
            if self.trust is not None:
                self.trust.granted(pod)
            asked = self.asks.get(pod)
            if asked is not None:
                self.woken_for[pod] = asked.at
                granted.append(Grant(pod=pod, model=asked.model, asked_at=asked.at))
        self.granted = decision.grant
        return Decided(after=decision, chosen=chosen, granted=granted, before=before)

    def untrusted(self, members: Iterable[Member]) -> set[str]:
        """The members counted whole: not trusted to free their memory, or asleep unasked."""
        distrusted = set() if self.trust is None else set(self.trust.untrusted)
        return {m.pod for m in members if m.pod in distrusted} | self.unasked

    # -- its parts -----------------------------------------------------------------------

    def _follow_wakes(self, members: Sequence[Member], present: set[str]) -> list[Member]:
        """Each member woken for an ask, with when that ask was made (forgotten once it
        sleeps again, and not granted). A member may come with it already (whatif's do: it
        saves a copy of each in every round)."""
        asleep = {m.pod for m in members if m.state is MemberState.ASLEEP}
        self.woken_for = {
            p: t
            for p, t in self.woken_for.items()
            if p in present and (p not in asleep or p in self.granted)
        }
        return [
            m
            if m.woken_for == self.woken_for.get(m.pod)
            else replace(m, woken_for=self.woken_for.get(m.pod))
            for m in members
        ]

    def _blame(self, found: Disagreement, restart_on_failure: Collection[str]) -> list[Blame]:
        """Stop trusting whom a wake out of memory is blamed on (a member whose run is not
        known is left alone), and restart those whose sleeps made that very room where their
        model says so."""
        assert self.trust is not None
        if not found.suspects:
            return [Blame(pod=None, failed=found.pod, made_room=False, restart=False)]
        blamed = []
        for pod in found.suspects:
            process = self.processes.get(pod)
            if process is None:
                continue
            self.trust.distrust(pod, process)
            restart = found.made_room and pod in restart_on_failure
            if restart:
                self.restart.add(pod)
            blamed.append(
                Blame(pod=pod, failed=found.pod, made_room=found.made_room, restart=restart)
            )
        return blamed

    def _follow_trust(
        self, members: list[Member], unasked: set[str]
    ) -> tuple[list[Member], list[str]]:
        """Each member as far as the pool trusts it: one whose sleep did not give its memory
        back, or that says it sleeps though Snooze never put it to sleep, counts at its whole
        footprint while asleep; and the members newly found so."""
        assert self.trust is not None
        self.restart &= set(self.trust.untrusted)
        untrusted = {
            m.pod for m in members if not self.trust.trusts(m.pod, self.processes.get(m.pod))
        }
        told = sorted(unasked - self.unasked)
        self.unasked = unasked
        whole = untrusted | unasked
        listed = [replace(m, residue=m.footprint) if m.pod in whole else m for m in members]
        return listed, told

    def _follow_sleeps(self, members: Iterable[Member]) -> list[WakeAsk]:
        """The wakes back of primed members. A sleep to make room runs in its model's loop
        until confirmed, cancelled (a headroom's or a prime's) or spared, and the member is
        draining meanwhile; a priming sleep that ended asleep is offered its room back, once
        and then as long as it is granted, unless the member's own model asks for it."""
        states = {m.pod: m.state for m in members}
        for pod, for_what in self.sleeping_for.items():
            if for_what == PRIME and states.get(pod) is MemberState.ASLEEP:
                self.priming.add(pod)
        self.sleeping_for = {
            p: f for p, f in self.sleeping_for.items() if states.get(p) is MemberState.DRAINING
        }
        self.priming = {
            p for p in self.priming if states.get(p) is MemberState.ASLEEP and p not in self.asks
        }
        return [WakeAsk(pod=p, asked_at=0.0, lazy=True) for p in sorted(self.priming)]
