"""A GPU pool in a whatif simulation: the members' engines as the pool's coordinator sees them,
its real decision (policy.pool.decide_pool) taken after every change over the same books as the
operator's pool loop keeps (policy.poolbooks), and what it tells each member's model (wake now,
sleep to make room, at which level), as that loop does; plus what it costs: swaps and waits for
room."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from snooze.api.gpupool import Eviction
from snooze.api.models import DesiredState, EngineState
from snooze.policy.pool.books import Directive, PoolBooks
from snooze.policy.pool.decision import (
    PRIME,
    Headroom,
    Member,
    MemberState,
    ModelNeeds,
    PoolDecision,
    PoolView,
    Prime,
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
        self.books = PoolBooks()
        """What the pool remembers between decisions, as the operator's pool loop keeps it
        (whatif judges no trust: its engines free what they say)."""
        self.directives: dict[str, Directive] = {}
        """What the last decision tells each member."""
        self._owner = {e.pod: m for m in self.models for e in m.engines}
        self._needs = {_key(m): _needs(m) for m in self.models}
        for model in self.models:
            model.pool = self

    # --- what the members' models call ---------------------------------------------------

    @property
    def decision(self) -> PoolDecision | None:
        return self.books.decision

    def view(self, engine: Engine, view: EngineView) -> EngineView:
        told = self.directives.get(engine.pod, Directive())
        return dataclasses.replace(
            view,
            pooled=True,
            pool_grant=told.grant,
            pool_evict=told.evict,
            pool_headroom=told.headroom,
            pool_promised=told.promised,
            pool_rewake=told.rewake,
            pool_level=told.level,
        )

    def ask(self, model: ModelSim, pods: list[str], now: float) -> None:
        """The model's members that want room now (the others of the model withdraw)."""
        self.books.ask(_key(model), pods, now)

    def made_room(self, model: ModelSim, engine: Engine, now: float) -> None:
        why = self.books.made_room(engine.pod)
        if why != PRIME and now >= model.measure_from:
            model.out.swaps += 1

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
                        woken_for=self.books.woken_for.get(e.pod),
                    )
                )
        return members

    def decide(self, now: float) -> set[int]:
        """Decide at `now`; the indices of the models whose members were told something new."""
        s = self.settings
        for model in self.models:
            model.retire(now, inclusive=True)
        followed = self.books.follow(self._members(now), now=now)
        members = followed.members
        decision = decide_pool(
            PoolView(
                memory=s.memory,
                host_memory=s.host_memory,
                eviction=s.eviction,
                min_residency=s.min_residency,
                members=members,
                asks=followed.asks,
                models=self._needs,
                now=now,
                headroom=s.headroom,
                prime=s.prime,
            )
        )
        decided = self.books.decided(decision, present={m.pod for m in members})
        for grant in decided.granted:
            # What a wake waited for room, from its ask (a wake back of a prime asked nothing).
            model = self._owner[grant.pod]
            if grant.asked_at >= model.measure_from:
                model.out.room_waits.append(now - grant.asked_at)
        before, self.directives = (
            self.directives,
            {m.pod: self.books.directive(m.pod) for m in members},
        )
        changed = {
            p
            for p in before.keys() | self.directives.keys()
            if before.get(p) != self.directives.get(p)
        }
        return {self._owner[p].index for p in changed}

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
