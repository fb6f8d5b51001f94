"""A GPU pool in a whatif simulation: the members' engines as the pool's coordinator sees them,
its real decision (policy.pool.decide_pool) taken after every change, and what it tells each
member's model (wake now, sleep to make room, at which level), as the operator's pool loop
does; plus what it costs: swaps and waits for room."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from snooze.api.gpupool import Eviction
from snooze.api.models import DesiredState, EngineState
from snooze.policy.pool import (
    PRIME,
    Headroom,
    Member,
    MemberState,
    ModelNeeds,
    PoolDecision,
    PoolView,
    Prime,
    RoomFor,
    WakeAsk,
    decide_pool,
)
from snooze.policy.sleep import EngineView
from snooze.whatif.engines import Engine
from snooze.whatif.model import EPSILON, ModelSim


@dataclass(frozen=True, kw_only=True)
class PoolSettings:
    """One GPUPool's spec, as the decision reads it."""

    name: str
    memory: int
    host_memory: int | None = None
    eviction: Eviction = Eviction.LEAST_RECENTLY_USED
    min_residency: float = 30.0
    headroom: Headroom | None = None
    prime: Prime | None = None


@dataclass(frozen=True, kw_only=True)
class Footprint:
    """What one member engine takes: awake, asleep, in host RAM at level 1; its priority."""

    memory: int
    asleep: int
    weights: int
    priority: int = 0


Directive = tuple[bool, bool, bool, bool, bool, int | None]
"""grant, evict, headroom, promised, rewake, level: as the operator's pool tells a member."""


class PoolSim:
    """The coordinator of one pool whose members are the engines of `models`."""

    def __init__(
        self,
        settings: PoolSettings,
        models: Sequence[ModelSim],
        footprints: Mapping[str, Footprint],
    ) -> None:
        self.settings = settings
        self.models = list(models)
        self.footprints = footprints
        self.asks: dict[str, float] = {}
        """Pod -> when it first asked for room."""
        self.decision: PoolDecision | None = None
        self.sleeping_for: dict[str, RoomFor | None] = {}
        """Member -> what its sleep under way makes room for (a promised drain is not
        cancelled; a prime's is followed by a wake back)."""
        self.priming: set[str] = set()
        self.woken_for: dict[str, float] = {}
        """Member -> when the wake that woke it was asked (see Member.woken_for)."""
        self.directives: dict[str, Directive] = {}
        self._owner = {e.pod: m for m in self.models for e in m.engines}
        self._needs = {_key(m): _needs(m) for m in self.models}
        for model in self.models:
            model.pool = self

    # --- what the members' models call ---------------------------------------------------

    def view(self, engine: Engine, view: EngineView) -> EngineView:
        grant, evict, headroom, promised, rewake, level = self.directives.get(
            engine.pod, (False, False, False, False, False, None)
        )
        return dataclasses.replace(
            view,
            pooled=True,
            pool_grant=grant,
            pool_evict=evict,
            pool_headroom=headroom,
            pool_promised=promised,
            pool_rewake=rewake,
            pool_level=level,
        )

    def ask(self, model: ModelSim, pods: list[str], now: float) -> None:
        """The model's members that want room now (the others of the model withdraw)."""
        mine = {e.pod for e in model.engines}
        for pod in [p for p in self.asks if p in mine and p not in pods]:
            del self.asks[pod]
        for pod in pods:
            self.asks.setdefault(pod, now)

    def made_room(self, model: ModelSim, engine: Engine, now: float) -> None:
        why = self.decision.evict.get(engine.pod) if self.decision is not None else None
        self.sleeping_for[engine.pod] = why
        if why != PRIME and now >= model.measure_from:
            model.out.swaps += 1

    def granted(self, engine: Engine, now: float) -> None:
        asked = self.asks.get(engine.pod)
        if asked is not None:
            # It passed every wake asked before this one: minResidency does not shield it
            # from those (the pool's rule against starvation), as the operator's pool says.
            self.woken_for[engine.pod] = asked
        model = self._owner[engine.pod]
        if asked is not None and asked >= model.measure_from:
            model.out.room_waits.append(now - asked)

    # --- the coordinator -----------------------------------------------------------------

    def _members(self, now: float) -> list[Member]:
        members = []
        for model in self.models:
            size = self.footprints[model.name]
            level = model.spec.sleep.level
            for e in model.engines:
                if not e.present:
                    continue
                state = _state(e)
                members.append(
                    Member(
                        pod=e.pod,
                        model=_key(model),
                        state=state,
                        footprint=size.memory,
                        residue=size.asleep,
                        priority=size.priority,
                        busy=bool(e.ends),
                        last_used=e.last_activity,
                        awake_since=e.resident_since,
                        level=(e.sleep_level or level) if state is MemberState.ASLEEP else level,
                        wake_seconds=model.lat.wake(level),
                        recent_requests=e.recent_requests(now),
                        weights=size.weights,
                        host_copy=e.pinned,
                        woken_for=self.woken_for.get(e.pod),
                    )
                )
        return members

    def decide(self, now: float) -> set[int]:
        """Decide at `now`; the indices of the models whose members were told something new."""
        s = self.settings
        for model in self.models:
            model.retire(now, inclusive=True)
        members = self._members(now)
        states = {m.pod: m.state for m in members}
        granted = self.decision.grant if self.decision is not None else frozenset()
        self.woken_for = {
            p: t
            for p, t in self.woken_for.items()
            if p in states and (states[p] is not MemberState.ASLEEP or p in granted)
        }
        for pod, why in self.sleeping_for.items():
            if why == PRIME and states.get(pod) is MemberState.ASLEEP:
                self.priming.add(pod)
        self.sleeping_for = {
            p: f for p, f in self.sleeping_for.items() if states.get(p) is MemberState.DRAINING
        }
        self.priming = {
            p for p in self.priming if states.get(p) is MemberState.ASLEEP and p not in self.asks
        }
        asks = [WakeAsk(pod=p, asked_at=t) for p, t in self.asks.items()]
        asks += [WakeAsk(pod=p, asked_at=0.0, lazy=True) for p in sorted(self.priming)]
        decision = decide_pool(
            PoolView(
                memory=s.memory,
                host_memory=s.host_memory,
                eviction=s.eviction,
                min_residency=s.min_residency,
                members=members,
                asks=asks,
                models=self._needs,
                now=now,
                headroom=s.headroom,
                prime=s.prime,
            )
        )
        self.decision = decision
        self.priming &= decision.grant
        before, self.directives = (
            self.directives,
            {m.pod: self._directive(m.pod, decision) for m in members},
        )
        changed = {
            p
            for p in before.keys() | self.directives.keys()
            if before.get(p) != self.directives.get(p)
        }
        return {self._owner[p].index for p in changed}

    def _directive(self, pod: str, decision: PoolDecision) -> Directive:
        why = decision.evict.get(pod)
        return (
            pod in decision.grant,
            why is not None,
            why is not None and not why.promised,
            (room := self.sleeping_for.get(pod)) is not None and room.promised,
            pod in decision.grant and pod in self.priming,
            decision.levels.get(pod),
        )

    def next_look(self, now: float) -> float | None:
        """When the decision may change by the passing of time alone: a member busy while a
        wake waits falls idle, one woken lately passes minResidency, one idle long enough for
        the headroom or the prime."""
        s = self.settings
        waiting = self.decision is not None and bool(self.decision.waiting)
        times = []
        for model in self.models:
            for e in model.engines:
                if not e.present or e.label is not EngineState.AWAKE or e.action is not None:
                    continue
                last = max(e.ends) if e.ends else e.last_activity
                # When it may be put to sleep for another: idle, and past its minResidency.
                movable = max(last, (e.resident_since or 0.0) + s.min_residency)
                if waiting:
                    times.append(movable)
                if s.headroom is not None:
                    times.append(max(movable, last + s.headroom.idle_after))
                if s.prime is not None and not e.pinned:
                    times.append(max(movable, last + s.prime.idle_after))
        future = [t for t in times if t + EPSILON > now]
        return max(min(future), now) + EPSILON if future else None


def _state(engine: Engine) -> MemberState:
    if engine.ready_at is not None:
        return MemberState.STARTING
    if engine.action is not None:
        return MemberState.WAKING if engine.label is EngineState.WAKING else MemberState.DRAINING
    return MemberState.ASLEEP if engine.sleeping else MemberState.AWAKE


def _key(model: ModelSim) -> str:
    """The model as the decision knows it: its place in the trace, never its name, which is
    data (a model named like the decision's own words, "prime" or "headroom", must not be
    read as one when the decision says what a sleep makes room for)."""
    return f"#{model.index}"


def _needs(model: ModelSim) -> ModelNeeds:
    spec = model.spec
    return ModelNeeds(min_awake=spec.min_awake, keep_awake=spec.desired_state is DesiredState.AWAKE)
