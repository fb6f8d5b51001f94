"""GPU pools in the operator: one coordinator loop per GPUPool reads a snapshot of its members
from the model loops, asks the pool policy who may wake and who sleeps to make room, keeps its
books (policy/pool/books.py), and hands the directives back to the model loops, which alone act
on engines. One place decides per pool."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from snooze.api.eventreasons import EventReason
from snooze.api.gpupool import GPUPoolSpec, GPUPoolStatus, parse_pool_spec, parse_pool_status
from snooze.api.models import GROUP, VERSION, InferenceModelSpec, SpecError
from snooze.api.modelstatus import merge_patch
from snooze.kube.api import KubeApi, Ref
from snooze.kube.pods import PodInfo, pool_name_of
from snooze.operator.events.emit import Emit
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.pool.members import gather
from snooze.operator.pool.snapshot import MemberSource, ModelSnapshot
from snooze.operator.pool.status import invalid_pool_status, pool_status
from snooze.operator.pool.tell import blame_message, making_room, unasked_message
from snooze.policy.pool.books import Decided, Directive, Followed, PoolBooks
from snooze.policy.pool.decision import (
    Headroom,
    Member,
    MemberState,
    PoolDecision,
    PoolView,
    Prime,
    Waiting,
    decide_pool,
    overcommitted,
)
from snooze.policy.probing import Traffic
from snooze.policy.runs import Process

log = logging.getLogger(__name__)


def pools_ref(namespace: str) -> Ref:
    return Ref(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/gpupools")


class PoolHub:
    """Every pool loop of this operator process, found by namespace and name, and what they
    read of the gateway."""

    def __init__(
        self,
        *,
        traffic: Callable[[str, str], Traffic | None] = lambda namespace, pod: None,
        hurry: Callable[[float], None] = lambda seconds: None,
        held: Callable[[str, str], int | None] = lambda namespace, model: None,
    ) -> None:
        self.loops: dict[tuple[str, str], PoolLoop] = {}
        self.traffic = traffic
        """An engine's requests through the gateway, as last scraped (None: unknown)."""
        self.hurry = hurry
        """Ask for the gateway's counters more often for a while."""
        self.held = held
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
        self.namespace, self.name = namespace, name
        self.body = body  # kopf's live view: its spec is read at each cycle
        self.api, self.hub, self.emit, self.metrics = api, hub, emit, metrics
        self.models = models
        """The model loops of its namespace."""
        self.expected = expected
        """The models of its namespace (as the operator's watches show them): the pool decides
        and writes its status only once each of their loops has cycled."""
        self.interval = interval
        self.spec: GPUPoolSpec | None = None
        self.poke_event = asyncio.Event()
        self.written = parse_pool_status(body.get("status"))
        """The status as last written (or found at start)."""
        # A restarted operator finds the host copies and its primes on the status: those
        # primed and asleep are woken back as the operator before it would have.
        self.books = PoolBooks.restored(
            evictions=self.written.evictions,
            copies={
                m.pod: Process(m.pod_uid, m.restarts) for m in self.written.members if m.host_copy
            },
            primed=[m.pod for m in self.written.members if m.primed],
            since=time.time(),
        )
        self.watching = False
        """A wake waits while awake members are busy: each fresh scrape of the gateway's
        counters makes the pool look again, so that it takes the first idle moment."""
        self._owners: dict[str, ModelSnapshot] = {}
        """Member -> its model, as the last snapshot showed it."""
        self._told: str | None = None

    # -- what the model loops call ------------------------------------------------------------

    @property
    def decision(self) -> PoolDecision | None:
        return self.books.decision

    def directive(self, pod: str) -> Directive:
        return self.books.directive(pod)

    def ask(self, model: str, pods: Iterable[str], now: float) -> None:
        """The model's members that want room now (the others of the model withdraw)."""
        if self.books.ask(model, pods, now):
            self.poke()

    def made_room(self, pod: str) -> None:
        """A member's sleep to make room has begun: counted as an eviction, and told in a
        MakingRoom Event, now (one chosen on an old probe and found busy is spared, and is
        neither)."""
        room = self.books.made_room(pod)
        self.metrics.pool_evictions.labels(self.namespace, self.name, room.kind.value).inc()
        owner = self._owners.get(pod)
        said = making_room(room, self._model_of)
        self.emit(
            "Normal",
            EventReason.MAKING_ROOM,
            f"{pod} ({owner.name if owner else '?'}) sleeps to {said}",
        )

    def waiting_for(self, pods: Iterable[str]) -> Waiting | None:
        return self.books.waiting_for(pods)

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
        self.books.decision = None
        for owner in self._owners.values():
            owner.poke()  # its members are no longer granted anything

    async def cycle(self) -> None:
        now = time.time()
        generation = (self.body.get("metadata") or {}).get("generation")
        try:
            spec = parse_pool_spec(dict(self.body.get("spec") or {}))
        except SpecError as exc:
            self.spec, self.books.decision = None, None
            await self._write_status(self._invalid_status(str(exc), generation, now))
            return
        self.spec = spec
        claims = self.hub.claims(self.namespace)
        models = [m.snapshot(pool=self.name, claims=claims, now=now) for m in self.models()]
        if not self._heard_from_all(models):
            # A partial view undercounts the device (a member not yet known holds its memory)
            # and, written, the status would forget the host copies of the members missing
            # from it: after a restart of the operator, a copy was lost so, and a member that
            # should have slept at level 2 slept at level 1.
            return
        found = gather(
            spec,
            models,
            copies=self.books.copies,
            traffic=lambda pod: self.hub.traffic(self.namespace, pod),
            now=now,
        )
        self._owners = found.owners
        followed = self.books.follow(
            found.members,
            now=now,
            held=lambda model: self.hub.held(self.namespace, model),
            processes=found.processes,
            failures=found.failures,
            unasked=found.unasked,
            restart_on_failure=found.restart_on_failure,
        )
        self._tell(followed)
        view = PoolView(
            memory=spec.memory_bytes,
            host_memory=spec.host_memory_bytes,
            eviction=spec.eviction,
            min_residency=spec.min_residency_seconds,
            members=followed.members,
            asks=followed.asks,
            models=found.needs,
            now=now,
            headroom=None
            if spec.headroom is None
            else Headroom(wakes=spec.headroom.wakes, idle_after=spec.headroom.idle_after_seconds),
            prime=None if spec.prime is None else Prime(idle_after=spec.prime.idle_after_seconds),
        )
        decision = decide_pool(view)
        decided = self.books.decided(decision, present=found.owners)
        # Watch only while a wake waits with nothing being put to sleep for it.
        self.watching = any(
            not w.making_room and not w.abandoned for w in decision.waiting
        ) and any(m.busy and m.state is MemberState.AWAKE for m in followed.members)
        if self.watching:
            self.hub.hurry(self.interval)
        self._publish(decided, now)
        await self._write_status(self._status(spec, followed.members, decision, generation, now))

    def _heard_from_all(self, models: list[ModelSnapshot]) -> bool:
        """Every model's loop (of those the pool knows of, and those the watches show) has
        cycled at least once."""
        heard = {m.name for m in models if m.cycled}
        waiting = {m.name for m in models if not m.cycled} | (set(self.expected()) - heard)
        if waiting:
            log.debug(
                "pool %s/%s waits for the first cycle of %s",
                *(self.namespace, self.name, ", ".join(sorted(waiting))),
            )
        return not waiting

    def _model_of(self, pod: str) -> str | None:
        owner = self._owners.get(pod)
        return None if owner is None else owner.name

    def _tell(self, followed: Followed) -> None:
        """What the books learnt of the members' sleeps, by Event."""
        for blame in followed.blamed:
            if blame.pod is not None:
                log.warning(
                    "pool %s/%s: %s did not free its memory", self.namespace, self.name, blame.pod
                )
            self.emit("Warning", EventReason.MEMORY_NOT_FREED, blame_message(blame, self._model_of))
        for pod in followed.unasked:
            self.emit(
                "Warning", EventReason.SLEEP_UNASKED, unasked_message(pod, self._model_of(pod))
            )

    def _publish(self, decided: Decided, now: float) -> None:
        for pod, room in decided.chosen:
            # The Event waits for the sleep to begin (made_room): a member chosen on an old
            # probe may turn out busy and be spared.
            log.info(
                "pool %s/%s: %s (%s) chosen to sleep to %s",
                *(self.namespace, self.name, pod, self._model_of(pod) or "?"),
                making_room(room, self._model_of),
            )
        for grant in decided.granted:
            self.metrics.observe_pool_wait(
                self.namespace, self.name, grant.model, now - grant.asked_at
            )
        for pod in decided.changed(self._owners):
            self._owners[pod].poke()

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
            self.emit("Warning", EventReason.OVERCOMMITTED, problem)
        self._told = problem
        return pool_status(
            spec,
            members,
            decision,
            awake=awake,
            asleep=asleep,
            problem=problem,
            claim_holder=None if holder == self.name else holder,
            processes=self.books.processes,
            primed=self.books.primed(),
            untrusted=self.books.untrusted(members),
            evictions=self.books.evictions,
            previous=self.written,
            generation=generation,
            now=now,
        )

    def _invalid_status(self, message: str, generation: int | None, now: float) -> GPUPoolStatus:
        if message != self._told:
            self.emit("Warning", EventReason.INVALID_SPEC, message)
            self._told = message
        return invalid_pool_status(message, previous=self.written, generation=generation, now=now)

    async def _write_status(self, new: GPUPoolStatus) -> None:
        if new == self.written:
            return
        await self.api.patch(
            pools_ref(self.namespace), self.name, {"status": merge_patch(new)}, sub="status"
        )
        self.written = new
