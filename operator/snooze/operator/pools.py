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
from dataclasses import dataclass, replace
from typing import Any

from snooze.api.gpupool import GPUPoolSpec, GPUPoolStatus, parse_pool_spec, parse_pool_status
from snooze.api.models import GROUP, VERSION, InferenceModelSpec, SpecError
from snooze.api.modelstatus import merge_patch
from snooze.kube.api import KubeApi, Ref
from snooze.kube.pods import PodInfo
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.poolmembers import MemberSource, pool_name_of, read_member
from snooze.operator.poolstatus import invalid_pool_status, pool_status
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
    RoomKind,
    Waiting,
    WakeAsk,
    decide_pool,
    overcommitted,
)
from snooze.policy.pooltrust import OUT_OF_MEMORY, Disagreement, Trust
from snooze.policy.probing import Traffic
from snooze.policy.runs import Process

log = logging.getLogger(__name__)
Emit = Callable[[str, str, str], None]


def pools_ref(namespace: str) -> Ref:
    return Ref(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/gpupools")


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
    restart: bool = False
    """Its sleep did not give the device its memory back, and its model's remedy for a failed
    engine is a restart (wake.onFailure: Restart): its pod is deleted."""


class PoolHub:
    """Every pool loop of this operator process, found by namespace and name."""

    def __init__(self) -> None:
        self.loops: dict[tuple[str, str], PoolLoop] = {}
        self.traffic: Callable[[str, str], Traffic | None] = lambda namespace, pod: None
        """An engine's requests through the gateway, as last scraped (None: unknown)."""
        self.hurry: Callable[[float], None] = lambda seconds: None
        """Ask for the gateway's counters more often for a while."""
        self.held: Callable[[str, str], int | None] = lambda namespace, model: None
        """Requests the gateway holds for a model's wake now (None: unknown)."""

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
        expected: Callable[[], Iterable[str]] = lambda: (),
    ) -> None:
        self.namespace = namespace
        self.expected = expected
        """The models of its namespace (as the operator's watches show them): the pool decides
        and writes its status only once each of their loops has cycled."""
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
        self.asks: dict[str, Asked] = {}
        """Pod -> its ask for room."""
        self._woken_for: dict[str, float] = {}
        """Member -> when the ask it was granted was made, until it sleeps again: the members
        it passed while they waited may take its room back (policy/pool.py)."""
        self.decision: PoolDecision | None = None
        self._evicted: set[str] = set()
        """Members told (by Event) to make room, while the decision stands."""
        self._room_for: dict[str, RoomFor] = {}
        """Member -> what it was last chosen to make room for: its sleep may begin after the
        decision has moved on (a starting member it made room for is loading by then)."""
        self._granted: set[str] = set()
        self._written = parse_pool_status(body.get("status"))
        self._evictions = self._written.evictions
        self._told: str | None = None
        self._sources: dict[str, MemberSource] = {}
        self.watching = False
        """A wake waits while awake members are busy: each fresh scrape of the gateway's
        counters makes the pool look again, so that it takes the first idle moment."""
        self._processes: dict[str, Process] = {}
        """Member -> its engine's process: which one the status's hostCopy speaks of."""
        self._copies: dict[str, Process] = {
            entry.pod: Process(entry.pod_uid, entry.restarts)
            for entry in self._written.members
            if entry.host_copy
        }
        """Member -> the engine process known to keep a host copy: read from the status once,
        then as the members are seen. A member missing from one cycle (its loop restarted,
        its pod not seen for a moment) keeps its entry: the copy is forgotten only when its
        engine is seen without it."""
        self._sleeping_for: dict[str, RoomFor] = {
            entry.pod: PRIME for entry in self._written.members if entry.primed
        }
        """Member -> what its sleep under way makes room for (from made_room until its sleep
        action ends): the decision lists only awake members to put to sleep, and a request for
        one whose drain makes room for a wake must not cancel that drain. A restarted operator
        finds its primes on the status (`primed`): those asleep are woken back as below."""
        self._priming: set[str] = set()
        """Members whose priming sleep ended asleep: each is woken back into its own room if
        that is still free (a lazy ask)."""
        self.trust = Trust(since=time.time())
        """Whose sleeps the pool no longer trusts to free their memory (policy/pooltrust.py)."""
        self._restart: set[str] = set()
        """Untrusted members whose model's remedy is a restart: their pods are deleted."""
        self._unasked: set[str] = set()
        """Members that say they sleep though Snooze never put them to sleep (their pod has no
        mark of a sleep of Snooze's): counted at their whole footprint until seen awake."""
        self._told_unasked: set[str] = set()

    # -- what the model loops call ------------------------------------------------------------

    def directive(self, pod: str) -> Directive:
        decision = self.decision
        if decision is None:
            return Directive()
        return Directive(
            grant=pod in decision.grant,
            evict=pod in decision.evict,
            headroom=pod in decision.evict and not decision.evict[pod].promised,
            promised=pod in self._sleeping_for and self._sleeping_for[pod].promised,
            rewake=pod in decision.grant and pod in self._priming,
            level=decision.levels.get(pod),
            restart=pod in self._restart and pod in self.trust.untrusted,
        )

    def ask(self, model: str, pods: Iterable[str], now: float) -> None:
        """The model's members that want room now (the others of the model withdraw)."""
        wanted = set(pods)
        before = {p for p, a in self.asks.items() if a.model == model}
        for pod in before - wanted:
            del self.asks[pod]
        for pod in wanted - before:
            self.asks[pod] = Asked(model=model, at=now)
        if wanted != before:
            self.poke()

    def made_room(self, pod: str) -> None:
        """A member's sleep to make room has begun: counted as an eviction, and told in a
        MakingRoom Event, now (one chosen on an old probe and found busy is spared, and is
        neither)."""
        room = self._room_for.pop(pod, None) or RoomFor(RoomKind.WAKE)
        self._sleeping_for[pod] = room
        self._evictions += 1
        self.metrics.pool_evictions.labels(self.namespace, self.name, room.kind.value).inc()
        source = self._sources.get(pod)
        owner = source.name if source is not None else "?"
        self.emit("Normal", "MakingRoom", f"{pod} ({owner}) sleeps to {self._making(room)}")

    def _making(self, room: RoomFor) -> str:
        """What a sleep makes room for, for people."""
        if room.kind is RoomKind.HEADROOM:
            return "keep room free for the next wake (headroom)"
        if room.kind is RoomKind.PRIME:
            return "pin its host copy ahead of need, and wakes again at once (prime)"
        if room.kind is RoomKind.START:
            return f"make room for starting {room.subject}"
        if room.kind is RoomKind.BOOKS:
            return (
                "make the pool's books good: they count more than its device holds (a member "
                "whose sleep frees nothing counts whole)"
            )
        source = self._sources.get(room.subject)
        return f"make room for {source.name if source is not None else 'another member'}"

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
        if not self._heard_from_all():
            # A partial view undercounts the device (a member not yet known holds its memory)
            # and, written, the status would forget the host copies of the members missing
            # from it: after a restart of the operator, a copy was lost so, and a member that
            # should have slept at level 2 slept at level 1.
            return
        members, needs, sources = self._gather(spec, now)
        self._sources = sources
        self._processes = {p: v for p, v in self._processes.items() if p in sources}
        for m in members:
            if m.host_copy:
                self._copies[m.pod] = self._processes[m.pod]
            else:
                self._copies.pop(m.pod, None)  # seen without one: a new engine process
        # Asks of pods that left the pool, or that woke meanwhile, lapse.
        for pod in [p for p in self.asks if p not in sources]:
            del self.asks[pod]
        for ask in self.asks.values():
            ask.follow(self.hub.held(self.namespace, ask.model), now)
        self.trust.follow(members, self._sleeping_for)
        members = self._follow_trust(self._follow_wakes(members), sources)
        lazy = self._follow_sleeps(members)
        view = PoolView(
            memory=spec.memory_bytes,
            host_memory=spec.host_memory_bytes,
            eviction=spec.eviction,
            min_residency=spec.min_residency_seconds,
            members=members,
            asks=[WakeAsk(pod=p, asked_at=a.at, abandoned=a.gone) for p, a in self.asks.items()]
            + lazy,
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
        self.watching = any(
            not w.making_room and not w.abandoned for w in decision.waiting
        ) and any(m.busy and m.state is MemberState.AWAKE for m in members)
        if self.watching:
            self.hub.hurry(self.interval)
        self._publish(decision, members, sources, now)
        await self._write_status(self._status(spec, members, decision, generation, now))

    def _heard_from_all(self) -> bool:
        """Every model's loop (of those the pool knows of, and those the watches show) has
        cycled at least once."""
        sources = list(self.models())
        heard = {s.name for s in sources if s.cycled}
        waiting = {s.name for s in sources if not s.cycled} | (set(self.expected()) - heard)
        if waiting:
            log.debug(
                "pool %s/%s waits for the first cycle of %s",
                *(self.namespace, self.name, ", ".join(sorted(waiting))),
            )
        return not waiting

    def _follow_trust(
        self, members: list[Member], sources: Mapping[str, MemberSource]
    ) -> list[Member]:
        """Each member as far as the pool trusts it: one whose sleep did not give its memory
        back (a wake counting on that memory ran out of memory), or that says it sleeps though
        Snooze never put it to sleep, counts at its whole footprint while asleep."""
        failures: dict[str, float] = {}
        for m in members:
            engine = sources[m.pod].engine_memory(m.pod)
            if engine is not None and engine.last_failure_reason == OUT_OF_MEMORY:
                failures[m.pod] = engine.last_failure or 0.0
        for found in self.trust.judge(members, failures):
            self._disagree(found, sources)
        self._restart &= set(self.trust.untrusted)
        untrusted = {
            m.pod for m in members if not self.trust.trusts(m.pod, self._processes.get(m.pod))
        }
        for pod in sorted(self._unasked - self._told_unasked):
            self.emit(
                "Warning",
                "SleepUnasked",
                f"{pod} ({sources[pod].name}) says it sleeps, but Snooze never put it to sleep "
                "(its pod has no mark of a sleep of Snooze's): the pool counts it at its whole "
                "footprint until it is seen awake",
            )
        self._told_unasked = set(self._unasked)
        whole = untrusted | self._unasked
        return [replace(m, residue=m.footprint) if m.pod in whole else m for m in members]

    def _disagree(self, found: Disagreement, sources: Mapping[str, MemberSource]) -> None:
        """A wake ran out of memory where the books had room: stop trusting whom it is blamed
        on, and say so (and restart them where their model's remedy is a restart, when their
        sleeps made that very room)."""
        failed = sources[found.pod].name if found.pod in sources else "?"
        if not found.suspects:
            self.emit(
                "Warning",
                "MemoryNotFreed",
                f"{found.pod} ({failed}): its wake ran out of memory where the pool's books had "
                "room, and no member asleep can be blamed: something outside the pool holds "
                "memory on its device",
            )
            return
        for pod in found.suspects:
            process = self._processes.get(pod)
            if process is None:
                continue
            self.trust.distrust(pod, process)
            source = sources[pod]
            restart = (
                found.made_room
                and source.spec is not None
                and source.spec.wake.on_failure == "Restart"
            )
            if restart:
                self._restart.add(pod)
            how = (
                "its sleep made the room for that wake"
                if found.made_room
                else "it is the likeliest to hold memory its sleep should have freed"
            )
            then = (
                "; its pod is restarted (wake.onFailure: Restart)"
                if restart
                else "; restart its pod to give the memory back"
            )
            log.warning("pool %s/%s: %s did not free its memory", self.namespace, self.name, pod)
            self.emit(
                "Warning",
                "MemoryNotFreed",
                f"{pod} ({source.name}) said it slept, but the device did not get its memory "
                f"back: {found.pod} ({failed}) ran out of memory waking where the pool's books "
                f"had room, and {how}. The pool counts {pod} at its whole footprint, asleep "
                f"too, until its engine restarts{then}",
            )

    def _follow_wakes(self, members: list[Member]) -> list[Member]:
        """Each member woken for an ask, with when that ask was made (forgotten once it
        sleeps again, and not granted)."""
        asleep = {m.pod for m in members if m.state is MemberState.ASLEEP}
        present = {m.pod for m in members}
        self._woken_for = {
            p: t
            for p, t in self._woken_for.items()
            if p in present and (p not in asleep or p in self._granted)
        }
        return [
            replace(m, woken_for=self._woken_for[m.pod]) if m.pod in self._woken_for else m
            for m in members
        ]

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
        unasked: set[str] = set()
        claims = self.hub.claims(self.namespace)
        copies = self._copies
        for source in self.models():
            model_spec = source.spec
            for pod in source.selected:
                if pool_name_of(pod, model_spec, claims) != self.name:
                    continue
                if not pod.scheduled:
                    continue  # not on any node yet (Pending): it holds nothing on this device
                sources[pod.name] = source
                traffic = self.hub.traffic(self.namespace, pod.name)
                member, process = read_member(
                    spec, source, pod, copies=copies, traffic=traffic, now=now
                )
                self._processes[pod.name] = process
                members.append(member)
                engine = source.engine_memory(pod.name)
                if (
                    member.state is MemberState.ASLEEP
                    and engine is not None
                    and engine.sleep_started_of(pod) is None
                ):
                    unasked.add(pod.name)
            if model_spec is not None and any(s is source for s in sources.values()):
                needs[source.name] = ModelNeeds(
                    # A keep-awake window's minAwake too: a member kept awake by its model's
                    # loop and put to sleep by the pool was woken again at once, putting a
                    # neighbour to sleep each time (round after round, minResidency apart).
                    min_awake=max(model_spec.min_awake, source.min_awake_now),
                    keep_awake=model_spec.desired_state.value == "Awake",
                )
        self._unasked = unasked
        return members, needs, sources

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
        for pod, room in decision.evict.items():
            if pod in self._evicted:
                continue
            self._evicted.add(pod)
            owner = sources[pod].name if pod in sources else "?"
            # The Event waits for the sleep to begin (made_room): a member chosen on an old
            # probe may turn out busy and be spared.
            log.info(
                "pool %s/%s: %s (%s) chosen to sleep to %s",
                *(self.namespace, self.name, pod, owner, self._making(room)),
            )
        self._evicted &= set(decision.evict)
        # A grant stands, and its ask keeps its place in the queue, until the member's own loop
        # starts the wake and withdraws the ask: a later ask must not take its room meanwhile.
        for pod in decision.grant - self._granted:
            asked = self.asks.get(pod)
            self.trust.granted(pod)
            if asked is not None:
                self._woken_for[pod] = asked.at
                self.metrics.observe_pool_wait(
                    self.namespace, self.name, asked.model, now - asked.at
                )
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
    ) -> GPUPoolStatus:
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
            untrusted={m.pod for m in members if m.pod in self.trust.untrusted} | self._unasked,
            evictions=self._evictions,
            previous=self._written,
            generation=generation,
            now=now,
        )

    def _invalid_status(self, message: str, generation: int | None, now: float) -> GPUPoolStatus:
        if message != self._told:
            self.emit("Warning", "InvalidSpec", message)
            self._told = message
        return invalid_pool_status(message, previous=self._written, generation=generation, now=now)

    async def _write_status(self, new: GPUPoolStatus) -> None:
        if new == self._written:
            return
        await self.api.patch(
            pools_ref(self.namespace), self.name, {"status": merge_patch(new)}, sub="status"
        )
        self._written = new
