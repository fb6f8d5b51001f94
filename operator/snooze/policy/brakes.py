"""What an engine's claims of sleep are believed as, when it contradicts itself; pure.

An engine changes between asleep and awake only when Snooze sleeps or wakes it, or when its
process is replaced. A claim that changes with neither in between is a contradiction: its
`/metrics` says asleep while `/is_sleeping` said awake after a wake, or its sleep-state gauge
flips from one scrape to the next. Each claim the operator believes moves the pod's label,
the model's status and perhaps a wake, so a claim that flips at every probe would cost API
writes at every probe, forever. The first contradiction is believed at once (a person may
have slept or woken the engine by hand); after it, one change is believed per hold, the hold
doubling with each one believed, from one probe interval up to `cap`; an engine that says
the same for `forgive` seconds starts afresh. Claims that Snooze's own actions make (the
answer of `/is_sleeping` after its `/sleep` or `/wake_up`) are always believed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from snooze.policy.runs import Process


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One answer of an engine about its sleep."""

    sleeping: bool
    at: float
    source: str
    """Where it was read, in words: `/metrics (vllm:engine_sleep_state)`, `/is_sleeping`..."""

    def said(self) -> str:
        return f"{'asleep' if self.sleeping else 'awake'} ({self.source})"


@dataclass(frozen=True, kw_only=True)
class Pace:
    """How fast belief in a self-contradicting engine may change."""

    base: float
    """The first hold, in seconds (the operator's probe interval)."""
    cap: float
    """The longest hold."""
    forgive: float
    """Seconds without a contradiction after which an engine starts afresh."""

    @classmethod
    def of(cls, interval: float) -> Pace:
        """Holds from one probe interval to thirty; forgiven after sixty quiet intervals."""
        return cls(base=interval, cap=30 * interval, forgive=60 * interval)

    def hold(self, strikes: int) -> float:
        if strikes <= 0:
            return 0.0
        return float(min(self.cap, self.base * 2 ** min(strikes - 1, 62)))


@dataclass(frozen=True, kw_only=True)
class Brake:
    """What the operator believes of one engine's sleep, and how far it trusts it."""

    believed: Claim | None = None
    """The claim it acts on (None: none yet)."""
    process: Process | None = None
    """The engine run that made it: a new run is a new engine."""
    strikes: int = 0
    """Contradictions believed since the engine was last forgiven."""
    held_until: float = -math.inf
    """No contradiction is believed before this instant."""
    last_strike: float | None = None
    told: bool = False
    """The Event saying it contradicts itself was posted for this episode."""

    def holding(self, now: float) -> bool:
        """A contradiction would not be believed now."""
        return self.strikes > 0 and now < self.held_until


@dataclass(frozen=True, kw_only=True)
class Heard:
    """A claim heard: the brake after it, and what is believed now."""

    brake: Brake
    sleeping: bool
    """What the operator acts on: the claim, or the belief it holds on to."""
    contradiction: tuple[Claim, Claim] | None = None
    """The two claims to tell of, once per episode: the belief and the claim against it."""


def hear(brake: Brake, claim: Claim, *, process: Process, prompted: bool, pace: Pace) -> Heard:
    """Pure: believe `claim` or hold on to the belief. `prompted`: Snooze slept or woke the
    engine (or tried to) since the belief was formed, so a change is no contradiction."""
    now = claim.at
    if brake.process is None or not brake.process.same_as(process):
        brake = Brake(process=process)  # a new run: nothing it did counts against this one
    if brake.strikes and brake.last_strike is not None and now - brake.last_strike >= pace.forgive:
        brake = replace(brake, strikes=0, held_until=-math.inf, last_strike=None, told=False)
    believed = brake.believed
    if believed is None or prompted or believed.sleeping == claim.sleeping:
        return Heard(brake=replace(brake, believed=claim), sleeping=claim.sleeping)
    pair = (believed, claim)
    if brake.holding(now):
        told = None if brake.told else pair
        return Heard(
            brake=replace(brake, told=True), sleeping=believed.sleeping, contradiction=told
        )
    strikes = brake.strikes + 1
    # Told from the second on: one alone may be a person sleeping or waking it by hand.
    told = pair if strikes >= 2 and not brake.told else None
    held = replace(
        brake,
        believed=claim,
        strikes=strikes,
        held_until=now + pace.hold(strikes),
        last_strike=now,
        told=brake.told or told is not None,
    )
    return Heard(brake=held, sleeping=claim.sleeping, contradiction=told)


def acted(brake: Brake, claim: Claim, *, process: Process) -> Brake:
    """Pure: Snooze's own action made `claim` (its check after a sleep or a wake): believed."""
    if brake.process is None or not brake.process.same_as(process):
        brake = Brake(process=process)
    return replace(brake, believed=claim)


def telling(pair: tuple[Claim, Claim], *, pace: Pace, brake: Brake, now: float) -> str:
    """The Event's message for a self-contradicting engine: its two claims and the hold."""
    first, second = pair
    hold = max(0.0, brake.held_until - now)
    return (
        f"its engine said {first.said()} and then {second.said()}, with no sleep or wake by "
        f"Snooze between them, {brake.strikes} time(s): Snooze believes one change of its "
        f"claims per {_seconds(hold)} from now on, doubling to {_seconds(pace.cap)} while it "
        f"contradicts itself (its label, its wakes and its sleeps wait meanwhile); it is "
        f"trusted again after {_seconds(pace.forgive)} without a contradiction"
    )


def _seconds(value: float) -> str:
    return f"{value:.0f}s" if value >= 10 else f"{value:.1f}s"
