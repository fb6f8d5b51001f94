"""GPU pools in the operator: one coordinator loop per GPUPool gathers its members from the model
loops, asks the pool policy who may wake and who sleeps to make room, and hands those
directives back to the model loops, which alone act on engines. One place decides per pool."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from snooze.gpupool import POOL_LABEL, GPUPoolSpec, parse_pool_spec
from snooze.kube.api import KubeApi, Ref
from snooze.kube.pods import PodInfo
from snooze.models import GROUP, VERSION, EngineState, InferenceModelSpec, SpecError
from snooze.operator.memory import EngineMemory, Process
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.poolstatus import invalid_pool_status, pool_status
from snooze.policy.pool import (
    CANCELLABLE,
    HEADROOM,
    PRIME,
    Headroom,
    Member,
    MemberState,
    ModelNeeds,
    PoolDecision,
    PoolView,
    Prime,
    Waiting,
    WakeAsk,
    decide_pool,
    overcommitted,
)
from snooze.policy.probing import Traffic

log = logging.getLogger(__name__)
JSON = dict[str, Any]
Emit = Callable[[str, str, str], None]
# vLLM's --gpu-memory-utilization when none is given (0.9 before 0.33, 0.92 since): what an
# engine takes on its device when nothing says otherwise.
DEFAULT_SHARE = 0.92
# What a wake costs by level when the model has no measured one yet (docs/vllm-contract.md's
# published figures).
WAKE_SECONDS = {1: 1.0, 2: 20.0}


def pools_ref(namespace: str) -> Ref:
    return Ref(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/gpupools")


@dataclass(frozen=True, kw_only=True)
class Directive:
    """What a pool says of one member now."""

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


class MemberSource(Protocol):
    """What a model's loop shows a pool of its engines (operator/loop.py's ModelLoop)."""

    name: str
    spec: InferenceModelSpec | None
    selected: list[PodInfo]

    @property
    def last_wake_seconds(self) -> float | None: ...

    def engine_memory(self, pod: str) -> EngineMemory | None: ...

    def poke(self) -> None: ...


def pool_name_of(
    pod: PodInfo, spec: InferenceModelSpec | None, claims: Mapping[str, str]
) -> str | None:
    """The pool a pod is a member of: its snooze.dev/pool label, else the pool whose
    ResourceClaim it references (`claims`: claim name -> pool), else its model's spec.pool."""
    label = pod.labels.get(POOL_LABEL)
    if label:
        return label
    for claim in sorted(pod.claims):
        if claim in claims:
            return claims[claim]
    return None if spec is None or spec.pool is None else spec.pool.name


class PoolHub:
    """Every pool loop of this operator process, found by namespace and name."""

    def __init__(self) -> None:
        self.loops: dict[tuple[str, str], PoolLoop] = {}
        self.traffic: Callable[[str, str], Traffic | None] = lambda namespace, pod: None
        """An engine's requests through the gateway, as last scraped (None: unknown)."""
        self.hurry: Callable[[float], None] = lambda seconds: None
        """Ask for the gateway's counters more often for a while."""

    def scraped(self) -> None:
        """The gateway's counters are fresh: pools that wait for a busy member look again."""
        for loop in self.loops.values():
            if loop.watching:
                loop.poke()

    def claims(self, namespace: str) -> dict[str, str]:
        """ResourceClaim -> the pool that names it; of two pools naming one claim, the first
        by name (deterministic; the other reports the clash on its status)."""
        found: dict[str, str] = {}
        for (ns, name), loop in sorted(self.loops.items()):
            claim = loop.spec.resource_claim_name if loop.spec is not None else None
            if ns == namespace and claim and claim not in found:
                found[claim] = name
        return found

    def pool_of(
        self, namespace: str, pod: PodInfo, spec: InferenceModelSpec | None
    ) -> tuple[str | None, PoolLoop | None]:
        """The pool a pod belongs to (by name) and its loop (None while the GPUPool is missing)."""
        name = pool_name_of(pod, spec, self.claims(namespace))
        return name, None if name is None else self.loops.get((namespace, name))


class PoolLoop:
    """Everything the operator does for one GPUPool."""

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        body: Mapping[str, Any],
        api: KubeApi,
        hub: PoolHub,
        models: Callable[[], Iterable[MemberSource]],
        emit: Emit,
        metrics: OperatorMetrics,
        interval: float,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.body = body
        self.api = api
        self.hub = hub
        self.models = models
        self.emit = emit
        self.metrics = metrics
        self.interval = interval
        self.spec: GPUPoolSpec | None = None
        self.poke_event = asyncio.Event()
        self.asks: dict[str, tuple[str, float]] = {}
        """Pod -> (its model, when it first asked for room)."""
        self.decision: PoolDecision | None = None
        self._evicted: set[str] = set()
        """Members told (by Event) to make room, while the decision stands."""
        self._room_for: dict[str, str] = {}
        """Member -> what it was last chosen to make room for: its sleep may begin after the
        decision has moved on (a starting member it made room for is loading by then)."""
        self._granted: set[str] = set()
        self._written: JSON = dict(body.get("status") or {})
        self._evictions = int(self._written.get("evictions") or 0)
        self._told: str | None = None
        self._sources: dict[str, MemberSource] = {}
        self.watching = False
        """A wake waits while awake members are busy: each fresh scrape of the gateway's
        counters makes the pool look again, so that it takes the first idle moment."""
        self._processes: dict[str, Process] = {}
        """Member -> its engine's process: which one the status's hostCopy speaks of."""
        self._sleeping_for: dict[str, str] = {
            str(entry.get("pod")): PRIME
            for entry in self._written.get("members") or []
            if isinstance(entry, Mapping) and entry.get("primed") is True
        }
        """Member -> what its sleep under way makes room for (from made_room until its sleep
        action ends): the decision lists only awake members to put to sleep, and a request for
        one whose drain makes room for a wake must not cancel that drain. A restarted operator
        finds its primes on the status (`primed`): those asleep are woken back as below."""
        self._priming: set[str] = set()
        """Members whose priming sleep ended asleep: each is woken back into its own room if
        that is still free (a lazy ask)."""

    # -- what the model loops call ------------------------------------------------------------

    def directive(self, pod: str) -> Directive:
        decision = self.decision
        if decision is None:
            return Directive()
        return Directive(
            grant=pod in decision.grant,
            evict=pod in decision.evict,
            headroom=decision.evict.get(pod) in CANCELLABLE,
            promised=pod in self._sleeping_for and self._sleeping_for[pod] not in CANCELLABLE,
            rewake=pod in decision.grant and pod in self._priming,
            level=decision.levels.get(pod),
        )

    def ask(self, model: str, pods: Iterable[str], now: float) -> None:
        """The model's members that want room now (the others of the model withdraw)."""
        wanted = set(pods)
        before = {p for p, (m, _) in self.asks.items() if m == model}
        for pod in before - wanted:
            del self.asks[pod]
        for pod in wanted - before:
            self.asks[pod] = (model, now)
        if wanted != before:
            self.poke()

    def made_room(self, pod: str) -> None:
        """A member's sleep to make room has begun: counted as an eviction, and told in a
        MakingRoom Event, now (one chosen on an old probe and found busy is spared, and is
        neither)."""
        for_what = self._room_for.pop(pod, "")
        self._sleeping_for[pod] = for_what
        if for_what == HEADROOM:
            reason, why = "headroom", "keep room free for the next wake (headroom)"
        elif for_what == PRIME:
            reason = "prime"
            why = "pin its host copy ahead of need, and wakes again at once (prime)"
        elif for_what.startswith("starting "):
            reason, why = "start", f"make room for {for_what}"
        else:
            reason, why = "wake", f"make room for {for_what or 'another member'}"
        self._evictions += 1
        self.metrics.pool_evictions.labels(self.namespace, self.name, reason).inc()
        source = self._sources.get(pod)
        owner = source.name if source is not None else "?"
        self.emit("Normal", "MakingRoom", f"{pod} ({owner}) sleeps to {why}")

    def waiting_for(self, pods: Iterable[str]) -> Waiting | None:
        decision = self.decision
        if decision is None:
            return None
        names = set(pods)
        return next((w for w in decision.waiting if w.pod in names), None)

    def poke(self) -> None:
        self.poke_event.set()

    # -- the loop -----------------------------------------------------------------------------

    async def run(self, stopped: Callable[[], bool]) -> None:
        self.metrics.start_pool(self.namespace, self.name)
        first = True
        while not stopped():
            try:
                await self.cycle()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("cycle of pool %s/%s failed", self.namespace, self.name)
            wait = self.interval * (random.random() if first else 1.0)
            first = False
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can lose a cancellation.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.poke_event.wait()
            self.poke_event.clear()

    def stop(self) -> None:
        self.metrics.forget_pool(self.namespace, self.name)
        self.decision = None
        for source in self._sources.values():
            source.poke()  # its members are no longer granted anything

    async def cycle(self) -> None:
        now = time.time()
        generation = (self.body.get("metadata") or {}).get("generation")
        try:
            spec = parse_pool_spec(dict(self.body.get("spec") or {}))
        except SpecError as exc:
            self.spec, self.decision = None, None
            await self._write_status(self._invalid_status(str(exc), generation, now))
            return
        self.spec = spec
        members, needs, sources = self._gather(spec, now)
        self._sources = sources
        self._processes = {p: v for p, v in self._processes.items() if p in sources}
        # Asks of pods that left the pool, or that woke meanwhile, lapse.
        for pod in [p for p in self.asks if p not in sources]:
            del self.asks[pod]
        lazy = self._follow_sleeps(members)
        view = PoolView(
            memory=spec.memory_bytes,
            host_memory=spec.host_memory_bytes,
            eviction=spec.eviction,
            min_residency=spec.min_residency_seconds,
            members=members,
            asks=[WakeAsk(pod=p, asked_at=t) for p, (_, t) in self.asks.items()] + lazy,
            models=needs,
            now=now,
            headroom=None
            if spec.headroom is None
            else Headroom(wakes=spec.headroom.wakes, idle_after=spec.headroom.idle_after_seconds),
            prime=None if spec.prime is None else Prime(idle_after=spec.prime.idle_after_seconds),
        )
        decision = decide_pool(view)
        # A wake back not granted lost its room to a wake that asked meanwhile: the member
        # sleeps on, with its copy pinned, as any sleeping member, until it is asked for.
        self._priming &= decision.grant
        # Watch only while a wake waits with nothing being put to sleep for it.
        self.watching = any(not w.making_room for w in decision.waiting) and any(
            m.busy and m.state is MemberState.AWAKE for m in members
        )
        if self.watching:
            self.hub.hurry(self.interval)
        self._publish(decision, members, sources, now)
        await self._write_status(self._status(spec, members, decision, generation, now))

    def _follow_sleeps(self, members: Iterable[Member]) -> list[WakeAsk]:
        """The wakes back of primed members. A sleep to make room runs in its model's loop
        until confirmed, cancelled (a headroom's or a prime's) or spared, and the member is
        draining meanwhile; a priming sleep that ended asleep is offered its room back, once
        and then as long as it is granted, unless the member's own model asks for it."""
        states = {m.pod: m.state for m in members}
        for pod, for_what in self._sleeping_for.items():
            if for_what == PRIME and states.get(pod) is MemberState.ASLEEP:
                self._priming.add(pod)
        self._sleeping_for = {
            p: f for p, f in self._sleeping_for.items() if states.get(p) is MemberState.DRAINING
        }
        self._priming = {
            p for p in self._priming if states.get(p) is MemberState.ASLEEP and p not in self.asks
        }
        return [WakeAsk(pod=p, asked_at=0.0, lazy=True) for p in sorted(self._priming)]

    def _gather(
        self, spec: GPUPoolSpec, now: float
    ) -> tuple[list[Member], dict[str, ModelNeeds], dict[str, MemberSource]]:
        members: list[Member] = []
        needs: dict[str, ModelNeeds] = {}
        sources: dict[str, MemberSource] = {}
        claims = self.hub.claims(self.namespace)
        # What the pool's status says of each member's copy, read once for the whole cycle.
        copies = {
            str(entry.get("pod")): Process(
                str(entry.get("podUid")), _restart_count(entry.get("restarts"))
            )
            for entry in self._written.get("members") or []
            if isinstance(entry, Mapping) and entry.get("hostCopy") is True
        }
        for source in self.models():
            model_spec = source.spec
            for pod in source.selected:
                if pool_name_of(pod, model_spec, claims) != self.name:
                    continue
                if not pod.scheduled:
                    continue  # not on any node yet (Pending): it holds nothing on this device
                sources[pod.name] = source
                members.append(self._member(spec, source, pod, copies, now))
            if model_spec is not None and any(s is source for s in sources.values()):
                needs[source.name] = ModelNeeds(
                    min_awake=model_spec.min_awake,
                    keep_awake=model_spec.desired_state.value == "Awake",
                )
        return members, needs, sources

    def _member(
        self,
        spec: GPUPoolSpec,
        source: MemberSource,
        pod: PodInfo,
        copies: Mapping[str, Process],
        now: float,
    ) -> Member:
        model_spec = source.spec
        engine = source.engine_memory(pod.name)
        pool_spec = None if model_spec is None else model_spec.pool
        footprint = pool_spec.memory_bytes if pool_spec is not None else None
        if footprint is None:
            share = (engine.gpu_share if engine is not None else None) or pod.gpu_memory_utilization
            footprint = int((share or DEFAULT_SHARE) * spec.memory_bytes)
        residue = pool_spec.asleep_bytes if pool_spec is not None else 2**30
        weights = (pool_spec.weights_bytes if pool_spec is not None else None) or max(
            footprint - residue, 0
        )
        level: int = model_spec.sleep.level if model_spec is not None else 1
        state = _state(pod, engine)
        if (
            state is MemberState.UNKNOWN
            and engine is not None
            and engine.last_failure_reason == "OutOfMemory"
            and engine.sleeping
            and not engine.acting
        ):
            # Its wake ran out of memory and it sleeps: part of it may still be mapped, so it
            # counts at its whole footprint; its next wake then needs no more room than that.
            state, residue = MemberState.ASLEEP, footprint
        if state is MemberState.ASLEEP and engine is not None and engine.sleep_level:
            level = engine.sleep_level
        process = Process.of(pod, model_spec.engine.port if model_spec is not None else None)
        self._processes[pod.name] = process
        written = copies.get(pod.name)
        awake_since = None if engine is None else engine.state_since.get(EngineState.AWAKE.value)
        return Member(
            pod=pod.name,
            model=source.name,
            state=state,
            footprint=footprint,
            residue=residue,
            priority=0 if pool_spec is None else pool_spec.priority,
            busy=self._busy(pod, engine),
            last_used=engine.last_activity if engine is not None else now,
            recent_requests=engine.recent_requests(now) if engine is not None else 0,
            awake_since=awake_since,
            level=level,
            wake_seconds=source.last_wake_seconds or WAKE_SECONDS.get(level, 1.0),
            weights=weights,
            # Its engine process keeps a pinned copy of its weights: seen asleep at level 1
            # by this operator, or by the one before it (the status's copy of the same run).
            host_copy=(engine is not None and engine.holds_host_copy(process))
            or (written is not None and written.same_as(process)),
        )

    def _busy(self, pod: PodInfo, engine: EngineMemory | None) -> bool:
        """Whether its engine serves requests now: as its model's loop last saw it, or, when
        the gateway's counters are fresher than that loop's last probe (or its check before a
        sleep) and carry all of its traffic, as they say (the loop reads them once per
        interval; a pool waiting for a busy member reads every scrape)."""
        if engine is None:
            return False
        traffic = self.hub.traffic(self.namespace, pod.name)
        if traffic is None or engine.direct_activity:
            return engine.busy
        seen = max(engine.last_probe or 0.0, engine.busy_at or 0.0)
        return traffic.in_flight > 0 or (engine.busy and seen > traffic.at)

    def _publish(
        self,
        decision: PoolDecision,
        members: list[Member],
        sources: Mapping[str, MemberSource],
        now: float,
    ) -> None:
        before = self.decision
        self.decision = decision
        self._room_for = {p: f for p, f in self._room_for.items() if p in sources}
        self._room_for.update(decision.evict)
        for pod, model in decision.evict.items():
            if pod in self._evicted:
                continue
            self._evicted.add(pod)
            owner = sources[pod].name if pod in sources else "?"
            # The Event waits for the sleep to begin (made_room): a member chosen on an old
            # probe may turn out busy and be spared.
            log.info(
                "pool %s/%s: %s (%s) chosen to sleep to make room for %s",
                *(self.namespace, self.name, pod, owner, model),
            )
        self._evicted &= set(decision.evict)
        # A grant stands, and its ask keeps its place in the queue, until the member's own loop
        # starts the wake and withdraws the ask: a later ask must not take its room meanwhile.
        for pod in decision.grant - self._granted:
            asked = self.asks.get(pod)
            if asked is not None:
                self.metrics.observe_pool_wait(self.namespace, self.name, asked[0], now - asked[1])
        self._granted = set(decision.grant)
        changed = {
            pod
            for pod in sources
            if before is None
            or (pod in before.grant) != (pod in decision.grant)
            or (pod in before.evict) != (pod in decision.evict)
            or before.levels.get(pod) != decision.levels.get(pod)
        }
        changed |= {w.pod for w in decision.waiting}
        for pod in changed:
            sources[pod].poke()

    def _status(
        self,
        spec: GPUPoolSpec,
        members: list[Member],
        decision: PoolDecision,
        generation: int | None,
        now: float,
    ) -> JSON:
        memory = spec.memory_bytes
        awake = sum(
            m.held
            for m in members
            if m.held == m.footprint
            and m.state is not MemberState.ASLEEP
            and m.pod not in decision.unplaced
        )
        asleep = sum(m.held for m in members if m.state is MemberState.ASLEEP)
        free = memory - decision.used
        self.metrics.set_pool_memory(
            self.namespace, self.name, awake=awake, asleep=asleep, free=max(free, 0)
        )
        problem = overcommitted(memory, members)
        self.metrics.set_pool_members(
            self.namespace,
            self.name,
            awake=sum(1 for m in members if m.state is MemberState.AWAKE),
            waiting=len(decision.waiting),
            overcommitted=problem is not None,
        )
        claim = spec.resource_claim_name
        holder = self.hub.claims(self.namespace).get(claim) if claim else None
        if problem != self._told and problem is not None:
            self.emit("Warning", "Overcommitted", problem)
        self._told = problem
        return pool_status(
            spec,
            members,
            decision,
            awake=awake,
            asleep=asleep,
            problem=problem,
            claim_holder=None if holder == self.name else holder,
            processes=self._processes,
            primed=self._priming | {p for p, f in self._sleeping_for.items() if f == PRIME},
            evictions=self._evictions,
            previous=self._written,
            generation=generation,
            now=now,
        )

    def _invalid_status(self, message: str, generation: int | None, now: float) -> JSON:
        if message != self._told:
            self.emit("Warning", "InvalidSpec", message)
            self._told = message
        return invalid_pool_status(message, previous=self._written, generation=generation, now=now)

    async def _write_status(self, new: JSON) -> None:
        if new == {k: self._written.get(k) for k in new}:
            return
        await self.api.patch(pools_ref(self.namespace), self.name, {"status": new}, sub="status")
        self._written = new


def _restart_count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _state(pod: PodInfo, engine: EngineMemory | None) -> MemberState:
    """A member's state from what its model's loop knows now (its actions first: they run
    ahead of the labels they write)."""
    if not pod.ready:
        return MemberState.STARTING
    if engine is None:
        return MemberState.UNKNOWN
    if engine.acting_kind == "Wake":
        return MemberState.WAKING
    if engine.acting_kind == "Sleep":
        return MemberState.DRAINING
    if engine.last_failure_reason == "OutOfMemory":
        # A wake that ran out of memory may leave part of the engine mapped on the device.
        return MemberState.UNKNOWN
    if engine.sleeping is None:
        return MemberState.UNKNOWN
    if engine.sleeping:
        return MemberState.ASLEEP
    if pod.state is EngineState.DRAINING:
        return MemberState.DRAINING
    return MemberState.AWAKE
