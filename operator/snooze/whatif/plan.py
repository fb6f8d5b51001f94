"""The plan: a packing of a trace's models onto devices, with as few devices as the search finds,
at which every model's p99 added latency stays within a target, each candidate pool replayed
through the pool's real decision.

The search (greedy, agglomerative, then spreading): every model starts on a device of its
own. At each step, the pairs of groups whose union fits one device (every member can wake with
the others asleep) are ranked by how often the union would have more members wanted than it
can keep awake: per minute of the measured span, the members with a request in it beyond what
fits awake at once, summed (a cheap estimate, from bit sets of each model's busy minutes). The
`tries` best ranked pairs are replayed, one after another, until one meets the target; it is
merged, and the next step begins. When no pair does, the smallest group is spread over the
others instead, a model at a time into the best ranked group that still meets the target with
it (the `tries` best each); when no group can be, the search ends. A union that failed is not
tried again, nor any group that contains it (adding a model to a pool does not make room in
it). Each replay is one pool's members alone on their device over the whole trace, and is
kept: the cost is some replays per device saved, a second or so each.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from snooze.api.models import InferenceModelSpec
from snooze.whatif.latency import Latencies
from snooze.whatif.layout import Layout, PoolFlags, PoolLayout
from snooze.whatif.model import TargetMissed
from snooze.whatif.policies import Policy
from snooze.whatif.pooling import Footprint
from snooze.whatif.report import Result, evaluate, percentile_of_all
from snooze.whatif.trace import Trace

MINUTE = 60.0
MODELS_LIMIT = 300
"""Models a plan takes at most: each step weighs every pair of groups (50 models plan in
minutes; the pairs grow with the square of the models)."""


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    device_memory: int
    sizes: Mapping[str, Footprint]
    """Each model's engine on the device."""
    target: float
    """The p99 added latency every model must keep, in seconds."""
    pool: PoolFlags
    member: InferenceModelSpec
    """The spec pool members run with (their idle policy and sleep level)."""
    latencies: Latencies
    measure_from: float
    tries: int = 10


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """One group of models on one device, replayed."""

    members: frozenset[str]
    p99: dict[str, float]
    """Each member's p99 added latency over its requests (0 for a model alone)."""
    held: int = 0
    requests: int = 0
    swaps: int = 0
    complete: bool = True
    """False: the replay stopped once a model missed the target (its p99 is at least the
    figure given; the others are not known)."""

    @property
    def worst(self) -> float:
        return max(self.p99.values(), default=0.0)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    devices: int
    worst: float
    """The worst model's p99 added latency over the whole packing."""
    chosen: bool = False


@dataclass(kw_only=True)
class Plan:
    groups: list[frozenset[str]]
    """Every model's device: pools (several models) and models alone."""
    verdicts: dict[frozenset[str], Verdict]
    candidates: list[Candidate] = field(default_factory=list)
    replays: int = 0
    seconds: float = 0.0

    @property
    def devices(self) -> int:
        return len(self.groups)

    @property
    def worst(self) -> float:
        return max((self.verdicts[g].worst for g in self.groups), default=0.0)


def fits(members: Iterable[str], sizes: Mapping[str, Footprint], memory: int) -> bool:
    """Whether each member can wake with every other member asleep."""
    chosen = [sizes[m] for m in members]
    asleep = sum(s.asleep for s in chosen)
    return all(s.memory - s.asleep + asleep <= memory for s in chosen)


def capacity(members: Iterable[str], sizes: Mapping[str, Footprint], memory: int) -> int:
    """How many members can be awake at once, at most (the smallest awake first)."""
    chosen = sorted((sizes[m] for m in members), key=lambda s: s.memory - s.asleep)
    held = sum(s.asleep for s in chosen)
    awake = 0
    for size in chosen:
        if held + size.memory - size.asleep > memory:
            break
        held += size.memory - size.asleep
        awake += 1
    return awake


def busy_minutes(trace: Trace, since: float) -> dict[str, int]:
    """Per model, a bit set of the minutes since `since` in which it has a request."""
    span = max(int((trace.last - since) // MINUTE) + 1, 1)
    out: dict[str, int] = {}
    for name, column in trace.models.items():
        bits = bytearray((span + 7) // 8)
        for at in column.at:
            if at >= since:
                minute = int((at - since) // MINUTE)
                bits[minute >> 3] |= 1 << (minute & 7)
        out[name] = int.from_bytes(bits, "little")
    return out


def crowding(members: Sequence[str], minutes: Mapping[str, int], room: int) -> int:
    """Member-minutes wanted beyond `room` awake at once: sum over minutes of the members
    with a request in it, less `room`, where more."""
    # levels[k]: the minutes in which at least k + 1 members have a request.
    levels: list[int] = []
    for name in members:
        bits = minutes[name]
        for k in range(len(levels), -1, -1):
            below = levels[k - 1] if k > 0 else -1
            if k == len(levels):
                levels.append(below & bits)
            else:
                levels[k] |= below & bits
    return sum(level.bit_count() for level in levels[room:])


def search(
    trace: Trace,
    settings: PlanSettings,
    *,
    progress: Callable[[str], None] = lambda _: None,
) -> Plan:
    """The packing with the fewest devices the search finds at the target (module docstring)."""
    return _Search(trace, settings, progress).run()


class _Search:
    def __init__(
        self, trace: Trace, settings: PlanSettings, progress: Callable[[str], None]
    ) -> None:
        self.trace = trace
        self.settings = settings
        self.progress = progress
        self.minutes = busy_minutes(trace, settings.measure_from)
        models = sorted(trace.models, key=lambda m: (-len(trace.models[m]), m))
        self.plan = Plan(
            groups=[frozenset({m}) for m in models],
            verdicts={
                frozenset({m}): Verdict(members=frozenset({m}), p99={m: 0.0}) for m in models
            },
        )
        self.failed: list[frozenset[str]] = []
        self.score: dict[frozenset[str], int] = {}

    def run(self) -> Plan:
        began = time.monotonic()
        plan = self.plan
        plan.candidates.append(Candidate(devices=plan.devices, worst=0.0))
        while self._merge() or self._dissolve():
            pass
        plan.candidates.append(Candidate(devices=plan.devices, worst=plan.worst, chosen=True))
        plan.seconds = time.monotonic() - began
        return plan

    def _rank(self, union: frozenset[str]) -> tuple[int, int, list[str]]:
        if union not in self.score:
            s = self.settings
            room = capacity(union, s.sizes, s.device_memory)
            self.score[union] = crowding(sorted(union), self.minutes, room)
        return self.score[union], sum(len(self.trace.models[m]) for m in union), sorted(union)

    def _options(self, unions: Iterable[frozenset[str]]) -> list[frozenset[str]]:
        """The unions worth a replay, best ranked first: those that fit one device and hold
        no union that missed the target already."""
        s = self.settings
        fitting = [
            u
            for u in unions
            if fits(u, s.sizes, s.device_memory) and not any(f <= u for f in self.failed)
        ]
        return sorted(fitting, key=self._rank)[: s.tries]

    def _meets(
        self, union: frozenset[str], groups: Sequence[frozenset[str]], *, more: int = 0
    ) -> bool:
        """Replay `union` (cached); record the packing `groups` (and `more` devices for
        models still to place) as a candidate; whether it meets the target."""
        plan, target = self.plan, self.settings.target
        if union not in plan.verdicts:
            plan.verdicts[union] = replay(self.trace, union, self.settings)
            plan.replays += 1
        verdict = plan.verdicts[union]
        others = [plan.verdicts[g].worst for g in groups if not g & union]
        devices = len(groups) + more
        plan.candidates.append(Candidate(devices=devices, worst=max([verdict.worst, *others])))
        ok = verdict.worst <= target
        self.progress(
            f"{devices} devices: {'+'.join(sorted(union))} p99 {verdict.worst:.2f}s "
            f"{'ok' if ok else 'over'}"
        )
        if not ok:
            self.failed.append(union)
        return ok

    def _merge(self) -> bool:
        """Put two groups on one device, the best ranked pair that meets the target."""
        plan = self.plan
        unions = (a | b for a, b in itertools.combinations(plan.groups, 2))
        for union in self._options(unions):
            packing = [g for g in plan.groups if not g & union] + [union]
            if self._meets(union, packing):
                plan.groups = packing
                return True
        return False

    def _dissolve(self) -> bool:
        """Spread the smallest group that can be spread over the others, one model at a time,
        each into the best ranked group that still meets the target with it."""
        plan = self.plan
        for victim in sorted(plan.groups, key=lambda g: (len(g), sorted(g))):
            placed = [g for g in plan.groups if g != victim]
            order = sorted(victim, key=lambda m: (-len(self.trace.models[m]), m))
            for n, model in enumerate(order):
                unions = {g | {model}: g for g in placed}
                for union in self._options(unions):
                    packing = [g for g in placed if g != unions[union]] + [union]
                    # Until its last model is placed, the group spread holds its device.
                    if self._meets(union, packing, more=int(n < len(order) - 1)):
                        placed = packing
                        break
                else:
                    break
            else:
                plan.groups = placed
                return True
        return False


def pool_name(n: int) -> str:
    return f"whatif-pool-{n}"


def layout_of(plan: Plan, settings: PlanSettings) -> Layout:
    """The plan's pools (groups of more than one model), named in order."""
    pools = [g for g in plan.groups if len(g) > 1]
    return Layout(
        pools=[
            pool_layout(pool_name(n), sorted(group), settings) for n, group in enumerate(pools, 1)
        ]
    )


def pool_layout(name: str, members: Sequence[str], settings: PlanSettings) -> PoolLayout:
    return PoolLayout(
        settings=settings.pool.settings(name, settings.device_memory),
        members={m: settings.sizes[m] for m in members},
    )


def member_policy(settings: PlanSettings) -> Policy:
    return Policy(name="plan", spec=settings.member)


def replay(trace: Trace, members: frozenset[str], settings: PlanSettings) -> Verdict:
    """The group's models alone on one device, over the whole trace's span."""
    names = sorted(members)
    alone = Trace(models={m: trace.models[m] for m in names})
    layout = Layout(pools=[pool_layout("candidate", names, settings)])
    try:
        result = evaluate(
            member_policy(settings),
            alone,
            latencies=settings.latencies,
            measure_from=settings.measure_from,
            layout=layout,
            span=(trace.first, trace.last),
            give_up_over=settings.target,
        )
    except TargetMissed as missed:
        # Cut short: that model's p99 is over the target, by at least this much.
        return Verdict(members=members, p99={missed.model: missed.at_least}, complete=False)
    return verdict_of(members, result)


def verdict_of(members: frozenset[str], result: Result) -> Verdict:
    return Verdict(
        members=members,
        p99={m: percentile_of_all(o.held, o.requests, 0.99) for m, o in result.per_model.items()},
        held=result.held_requests,
        requests=result.requests,
        swaps=result.swaps,
    )
