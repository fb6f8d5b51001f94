"""Pre-wake and `idle.after: Auto`, decided from what a model's own traffic taught: a weekly
profile of when requests arrive after idleness, and a histogram of its idle gaps; pure (the
clock is an argument), each learnt state a small value that round-trips through the status."""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from functools import cache, cached_property
from zoneinfo import ZoneInfo

from snooze.api.keepawake import PROFILE_SLOT_MINUTES
from snooze.api.models import AUTO, InferenceModelSpec

SLOT_SECONDS = PROFILE_SLOT_MINUTES * 60
SLOTS = 7 * 24 * 3600 // SLOT_SECONDS
LEVELS = 10
"""A slot's strength is one digit, 0 to 9."""
ARRIVAL_GAIN = 2
"""What a request arriving after idleness (or after a pre-wake) adds to its slot."""
MISS_LOSS = 1
"""What a pre-wake that no request followed takes from its slot. Gains of 2 against losses of
1 keep pre-waking a slot whose requests come more than one week in three."""
HOT = 2
"""The strength from which a slot is pre-woken: one arrival is enough to expect the next."""


CLOCK_CHANGE_SLOTS = 2 * 3600 // SLOT_SECONDS
"""Slots of real time a week of local time can gain when the clocks go back (one hour in most
zones; two is the most any zone has used): a slot hot on the Sunday of a change, seen from the
week before, is that much further away."""


@cache
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def slot_of(now: float, zone: str) -> int:
    """The slot of the week (Monday 00:00 local time is 0) that `now` falls in."""
    return _slot(datetime.fromtimestamp(now, _zone(zone)))


def _slot(local: datetime) -> int:
    minutes = local.weekday() * 1440 + local.hour * 60 + local.minute
    return minutes // PROFILE_SLOT_MINUTES


def slot_start(now: float, zone: str) -> float:
    """When the slot that `now` falls in began (local slot boundaries, in real seconds)."""
    local = datetime.fromtimestamp(now, _zone(zone))
    into = (local.minute % PROFILE_SLOT_MINUTES) * 60 + local.second + local.microsecond / 1e6
    return now - into


class ProfileError(ValueError):
    """A stored profile that cannot be read (it is then learnt afresh)."""


@dataclass(frozen=True, kw_only=True)
class Profile:
    """How strongly requests are expected after idleness, per 10-minute slot of the week."""

    zone: str = "UTC"
    strengths: tuple[int, ...] = (0,) * SLOTS

    @classmethod
    def decode(cls, text: str, zone: str) -> Profile:
        """Read a profile from its status form; an empty text is an empty profile."""
        if not text:
            return cls(zone=zone)
        if len(text) != SLOTS or not text.isdigit() or not text.isascii():
            raise ProfileError(f"a profile is {SLOTS} digits, not {len(text)} characters")
        return cls(zone=zone, strengths=tuple(int(c) for c in text))

    def encode(self) -> str:
        return "".join(str(s) for s in self.strengths)

    def _add(self, now: float, delta: int) -> Profile:
        slot = slot_of(now, self.zone)
        strengths = list(self.strengths)
        strengths[slot] = min(LEVELS - 1, max(0, strengths[slot] + delta))
        return replace(self, strengths=tuple(strengths))

    def arrival(self, now: float) -> Profile:
        """A request arrived at `now` after idleness (it found the model asleep, or followed a
        pre-wake): its slot is expected again next week."""
        return self._add(now, ARRIVAL_GAIN)

    def miss(self, slot_time: float) -> Profile:
        """A pre-wake for the slot at `slot_time` saw no request."""
        return self._add(slot_time, -MISS_LOSS)

    def hot(self, now: float) -> bool:
        return self.strengths[slot_of(now, self.zone)] >= HOT

    def due(self, now: float, lead: float) -> float | None:
        """The start of the slot to pre-wake for at `now`: the hot slot that `now + lead` falls
        in; None when it is not hot."""
        ahead = now + lead
        return slot_start(ahead, self.zone) if self.hot(ahead) else None

    @cached_property
    def _hot_slots(self) -> tuple[int, ...]:
        return tuple(i for i, s in enumerate(self.strengths) if s >= HOT)

    def next_prewake(self, now: float, lead: float) -> float | None:
        """The earliest instant at or after `now` when `due` holds (within a week of local
        time, which is up to two hours more in real time when the clocks go back)."""
        if self.due(now, lead) is not None:
            return now
        hot = self._hot_slots
        if not hot:
            return None
        zone = _zone(self.zone)
        boundary = slot_start(now + lead, self.zone) + SLOT_SECONDS
        last = boundary + (SLOTS + CLOCK_CHANGE_SLOTS) * SLOT_SECONDS
        while boundary <= last:
            local = datetime.fromtimestamp(boundary, zone)
            slot = _slot(local)
            if self.strengths[slot] >= HOT:
                return boundary - lead
            # Jump to the next hot slot's start, when the clock's offset from UTC is the same
            # there (no DST change between: every boundary skipped was a cold slot's start);
            # across a change, step one slot at a time, as the local slots skip or repeat.
            after = bisect_right(hot, slot)
            ahead = (hot[after] if after < len(hot) else hot[0] + SLOTS) - slot
            jump = boundary + ahead * SLOT_SECONDS
            same = jump <= last and datetime.fromtimestamp(jump, zone).utcoffset() == (
                local.utcoffset()
            )
            boundary = jump if same else boundary + SLOT_SECONDS
        return None


class Outcome(StrEnum):
    HIT = "Hit"
    MISS = "Miss"


@dataclass(frozen=True, kw_only=True)
class Prewake:
    """A pre-wake in flight: when it fired and the slot it was for."""

    at: float
    slot: float

    @property
    def deadline(self) -> float:
        """A request by the end of its slot makes it a hit."""
        return self.slot + SLOT_SECONDS

    def outcome(self, last_request: float | None, now: float) -> Outcome | None:
        """HIT once a request came after it, MISS once its slot ended without one, else None."""
        if last_request is not None and self.at <= last_request <= self.deadline:
            return Outcome.HIT
        if now >= self.deadline:
            return Outcome.MISS
        return None


# The idle-gap histogram of "Serverless in the Wild" (Shahrad et al., ATC'20): one-minute bins
# over four hours, gaps longer than that counted apart. The keep-alive covers the 99th
# percentile of the gaps (plus a 10% margin) when the histogram is representative; otherwise
# it falls back to the user's longest keep-alive.
GAP_BIN_SECONDS = 60
GAP_BINS = 240
GAP_PERCENTILE = 0.99
GAP_MARGIN = 1.1
GAP_MIN_SAMPLES = 10
GAP_MAX_OUT_OF_BOUNDS = 0.5
GAP_MIN_CV = 2.0
GAP_MAX_SAMPLES = 1000
"""Past this many gaps every count is halved: recent behaviour weighs more, and the histogram
stays small."""


@dataclass(frozen=True, kw_only=True)
class GapHistogram:
    counts: tuple[int, ...] = (0,) * GAP_BINS
    over: int = 0
    """Gaps longer than the histogram's range."""

    @property
    def total(self) -> int:
        return sum(self.counts) + self.over

    @classmethod
    def decode(cls, text: str) -> GapHistogram:
        """Read `minute:count` pairs (and `over:count`); empty is an empty histogram."""
        counts = [0] * GAP_BINS
        over = 0
        for part in text.split():
            key, sep, value = part.partition(":")
            if not sep or not value.isdigit():
                raise ProfileError(f"{part!r} is not minute:count")
            if key == "over":
                over = int(value)
            elif key.isdigit() and int(key) < GAP_BINS:
                counts[int(key)] = int(value)
            else:
                raise ProfileError(f"{part!r}: the minute is 0 to {GAP_BINS - 1} or 'over'")
        return cls(counts=tuple(counts), over=over)

    def encode(self) -> str:
        parts = [f"{i}:{c}" for i, c in enumerate(self.counts) if c]
        if self.over:
            parts.append(f"over:{self.over}")
        return " ".join(parts)

    def add(self, gap: float) -> GapHistogram:
        """Count one idle gap (seconds without a request)."""
        counts, over = list(self.counts), self.over
        index = int(gap // GAP_BIN_SECONDS)
        if index >= GAP_BINS:
            over += 1
        else:
            counts[max(index, 0)] += 1
        if sum(counts) + over > GAP_MAX_SAMPLES:
            counts, over = [c // 2 for c in counts], over // 2
        return GapHistogram(counts=tuple(counts), over=over)

    def keep_alive(self, shortest: float, longest: float) -> float:
        """The keep-alive, in seconds, within [shortest, longest]."""
        total = self.total
        if total < GAP_MIN_SAMPLES or self.over > GAP_MAX_OUT_OF_BOUNDS * total:
            return longest
        inside = sum(self.counts)
        mean = inside / GAP_BINS
        spread = math.sqrt(sum((c - mean) ** 2 for c in self.counts) / GAP_BINS)
        if mean == 0 or spread / mean < GAP_MIN_CV:
            return longest  # gaps spread evenly: no pattern to cut the keep-alive to
        need = GAP_PERCENTILE * total
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= need:
                tail = (index + 1) * GAP_BIN_SECONDS * GAP_MARGIN
                return min(max(tail, shortest), longest)
        return longest  # the percentile lies among the gaps past the histogram's range


def effective_spec(spec: InferenceModelSpec, gaps: GapHistogram) -> InferenceModelSpec:
    """The spec with `idle.after: Auto` replaced by the keep-alive the gaps choose."""
    if spec.idle.after != AUTO:
        return spec
    seconds = gaps.keep_alive(spec.idle.auto.min_seconds, spec.idle.auto.max_seconds)
    idle = spec.idle.model_copy(update={"after": auto_duration(seconds)})
    return spec.model_copy(update={"idle": idle})


def auto_duration(seconds: float) -> str:
    """A duration string for a chosen keep-alive, whole seconds (never zero)."""
    return f"{max(1, round(seconds))}s"


GAP_RESOLUTION_SECONDS = 10.0
"""Idle gaps shorter than this are not counted: the operator sees activity at its probe
interval (10 s by default), and a simulation counts what the operator would."""


@dataclass(frozen=True, kw_only=True)
class Learnt:
    """What one model's traffic taught, and the pre-wake in flight: the operator keeps it on
    the status, `snooze whatif` in memory; both drive it through `request` and `tick`."""

    profile: Profile = Profile()
    gaps: GapHistogram = GapHistogram()
    pending: Prewake | None = None
    last_slot: float | None = None
    """The slot last pre-woken for, so that a slot is pre-woken once."""
    last_prewake: float | None = None
    prewakes: int = 0
    hits: int = 0
    misses: int = 0

    def request(self, now: float, *, idle_since: float | None, found_asleep: bool) -> Learnt:
        """A request arrived at `now`; the model had no request since `idle_since`, and had
        no awake engine for it when `found_asleep`."""
        learnt = self
        if idle_since is not None and now - idle_since >= GAP_RESOLUTION_SECONDS:
            learnt = replace(learnt, gaps=learnt.gaps.add(now - idle_since))
        if learnt.pending is not None and learnt.pending.outcome(now, now) is Outcome.HIT:
            return replace(
                learnt, profile=learnt.profile.arrival(now), pending=None, hits=learnt.hits + 1
            )
        if found_asleep:
            learnt = replace(learnt, profile=learnt.profile.arrival(now))
        return learnt

    def tick(self, now: float, *, lead: float, asleep: bool) -> tuple[Learnt, bool]:
        """Settle a pre-wake whose slot ended without a request, and say whether to pre-wake
        now: the model sleeps and a hot slot begins within `lead`."""
        learnt = self
        if learnt.pending is not None and learnt.pending.outcome(None, now) is Outcome.MISS:
            learnt = replace(
                learnt,
                profile=learnt.profile.miss(learnt.pending.slot),
                pending=None,
                misses=learnt.misses + 1,
            )
        slot = learnt.profile.due(now, lead)
        # Only ahead of a slot: once it has begun, its requests are coming or have come.
        if not asleep or slot is None or slot <= now or slot == learnt.last_slot:
            return learnt, False
        if learnt.pending is not None:
            return learnt, False
        fired = Prewake(at=now, slot=slot)
        return (
            replace(
                learnt,
                pending=fired,
                last_slot=slot,
                last_prewake=now,
                prewakes=learnt.prewakes + 1,
            ),
            True,
        )

    def next_event(self, now: float, *, lead: float) -> float | None:
        """When `tick` may next have something to do: a pre-wake's slot ending, or the next
        hot slot coming within `lead` (a simulation's clock jumps there). The slot due now,
        if any, is not one: `tick` has just seen it, and only an event (the model falling
        asleep) can change its answer."""
        times = [self.pending.deadline] if self.pending is not None else []
        due = self.profile.due(now, lead)
        after = now if due is None else due + SLOT_SECONDS - lead
        ahead = self.profile.next_prewake(after, lead)
        if ahead is not None:
            times.append(ahead)
        return min(times) if times else None
