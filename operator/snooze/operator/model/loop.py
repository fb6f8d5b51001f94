"""One model's loop: find its pods, probe their engines, ask the policy, act, report status."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from snooze.api.models import (
    EngineState,
    InferenceModelSpec,
    LabelSelector,
    SpecError,
    SpecMemo,
)
from snooze.api.modelstatus import parse_status
from snooze.engine.client import EngineHttp
from snooze.engine.probe import Prober
from snooze.kube.api import KubeApi
from snooze.kube.pods import PodInfo
from snooze.operator.events.emit import Emit
from snooze.operator.memory import ModelMemory, rebuild
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.model import wakerequest
from snooze.operator.model.actions import Executor
from snooze.operator.model.foresight import Foresight
from snooze.operator.model.reporter import StatusReporter
from snooze.operator.model.scaling import Scaler, Workload
from snooze.operator.model.selection import NO_NEIGHBOURS, Neighbours, PodChooser, Selection
from snooze.operator.model.views import EngineViews
from snooze.operator.pool.asks import PoolAsks
from snooze.operator.pool.loop import PoolHub
from snooze.operator.pool.snapshot import ModelSnapshot, take_snapshot
from snooze.operator.settings import Settings, sleep_timeout
from snooze.operator.status import model as status
from snooze.operator.traffic.pickers import PickerQueues
from snooze.operator.traffic.pickerwake import PickerWaker
from snooze.policy import claims, probing
from snooze.policy import scale as scale_policy
from snooze.policy import schedule as schedule_policy
from snooze.policy import sleep as sleep_policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """What a cycle decided, for its actions."""

    decided: InferenceModelSpec
    """The spec as the schedule and pre-wake have it now, bounded to the engines it can have."""
    wake_requested: float | None
    actions: list[sleep_policy.Action]
    replicas: int | None
    """The workload's replicas as read (None: no workload, or not known)."""
    answered: str | None = None
    """The wake request's annotation, when a wake answered it and it is to be cleared."""


# A cycle meant for an idle deadline comes this long after it: the clock read in the cycle
# must be past the deadline for the sleep decision to see it.
DEADLINE_SLACK = 0.05


class ModelLoop:
    """Everything the operator does for one InferenceModel."""

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        body: Mapping[str, Any],
        pods: Callable[[LabelSelector], Iterable[PodInfo]],
        api: KubeApi,
        prober: Prober,
        action_http: EngineHttp,
        settings: Settings,
        emit: Emit,
        metrics: OperatorMetrics,
        neighbours: Neighbours = NO_NEIGHBOURS,
        pools: PoolHub | None = None,
        traffic: Callable[[str, str], probing.Traffic | None] = lambda namespace, pod: None,
        spec_memo: SpecMemo | None = None,
        pickers: PickerQueues | None = None,
    ) -> None:
        self.namespace = namespace
        self.spec_memo = spec_memo or SpecMemo()
        """The spec validated once per change (shared with the operator's model index)."""
        self.pools = pools or PoolHub()
        self.spec: InferenceModelSpec | None = None
        """The last valid spec (for the GPU pool this model's engines are members of)."""
        self.selected: list[PodInfo] = []
        """The pods this loop acts on, as of its last cycle."""
        self.cycled = False
        """Its first cycle has run: its pods are known (a GPU pool waits for every model's)."""
        self.min_awake_now = 0
        """The engines it keeps awake now (minAwake, or a keep-awake window's, bounded by the
        engines it can have): its GPU pool puts none of them to sleep for a neighbour."""
        self._idle_deadline: float | None = None
        """When an awake engine's idle.after ends, if before the next regular cycle could see
        it (policy/sleep.py next_idle_deadline): the loop's next cycle comes then."""
        self.metrics = metrics
        self.name = name
        self.body = body  # kopf's live view: it follows the resource as it changes
        self.api = api
        self.settings = settings
        self.emit = emit
        written = parse_status(body.get("status"))
        self.memory: ModelMemory = rebuild(
            written, unwritten=settings.status_interval, now=time.time()
        )
        if self.memory.last_activity is None:
            # The model's idle clock starts when the operator first sees it.
            self.memory.last_activity = time.time()
        self.executor = Executor(
            namespace=namespace,
            api=api,
            http=action_http,
            memory=self.memory,
            settings=settings,
            emit=emit,
            metrics=metrics,
            model=name,
            pool_of=lambda pod: self.pools.pool_of(namespace, pod, self.spec)[0],
            made_room=self._made_room,
        )
        self.picker = PickerWaker(
            namespace=namespace, name=name, api=api, pickers=pickers, emit=emit
        )
        """What the Inference Extension's endpoint pickers queue for it (none: nothing)."""
        self.scaler = Scaler(
            namespace=namespace, model=name, api=api, memory=self.memory, emit=emit, metrics=metrics
        )
        self.foresight = Foresight(
            namespace=namespace,
            name=name,
            status=written,
            emit=emit,
            metrics=metrics,
            probe_interval=settings.probe_interval,
        )
        self.reporter = StatusReporter(
            namespace=namespace,
            name=name,
            api=api,
            settings=settings,
            emit=emit,
            metrics=metrics,
            memory=self.memory,
            foresight=self.foresight,
            written=written,
        )
        self.clearer = wakerequest.Clearer(api=api, namespace=namespace, name=name)
        self.chooser = PodChooser(
            namespace=namespace,
            name=name,
            pods=pods,
            neighbours=neighbours,
            memory=self.memory,
            emit=emit,
        )
        self.views = EngineViews(
            namespace=namespace,
            name=name,
            memory=self.memory,
            prober=prober,
            http=action_http,
            settings=settings,
            traffic=traffic,
            pools=self.pools,
            emit=emit,
            metrics=metrics,
        )
        self.asks = PoolAsks(namespace=namespace, name=name, pools=self.pools, emit=emit)
        self.selector: LabelSelector | None = None

    async def run(self, stopped: Callable[[], bool]) -> None:
        """Cycle until `stopped()`: checked after each cycle, so poke the memory to stop."""
        first = True
        while not stopped():
            began = time.monotonic()
            try:
                await self.cycle()
            except asyncio.CancelledError:
                raise
            except Exception:
                # One bad cycle must not end the model's loop; the next one starts afresh.
                log.exception("cycle of %s/%s failed", self.namespace, self.name)
                self.metrics.reconcile_errors.labels(self.namespace, self.name).inc()
            self.metrics.cycle_duration.observe(time.monotonic() - began)
            self.cycled = True
            # Loops started together (an operator restart) would probe in lockstep, thousands
            # of requests at once; a random first wait spreads them over the interval for good.
            wait = self.settings.probe_interval * (random.random() if first else 1.0)
            first = False
            if self._idle_deadline is not None:
                # An engine's idle.after ends before the next regular cycle: the cycle then
                # decides its sleep (on a probe at most one interval old), where waiting for
                # the regular one would add up to a whole interval to every sleep.
                wait = min(wait, max(0.0, self._idle_deadline - time.time()) + DEADLINE_SLACK)
            # asyncio.timeout, not wait_for: on Python 3.11, wait_for loses a cancellation that
            # arrives as the poke does, and a cancelled loop would then carry on.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.memory.poke.wait()
            self.memory.poke.clear()

    def _made_room(self, pod: PodInfo) -> None:
        _, pool = self.pools.pool_of(self.namespace, pod, self.spec)
        if pool is not None:
            pool.made_room(pod.name)

    def snapshot(self, *, pool: str, claims: Mapping[str, str], now: float) -> ModelSnapshot:
        """Its pods on GPU pool `pool`, and what it knows of their engines now."""
        return take_snapshot(
            name=self.name,
            cycled=self.cycled,
            spec=self.spec,
            min_awake_now=self.min_awake_now,
            last_wake_seconds=self.memory.last_wake_seconds,
            selected=self.selected,
            engines=self.memory.engines,
            poke=self.poke,
            pool=pool,
            claims=claims,
            now=now,
        )

    def poke(self) -> None:
        self.memory.poke.set()

    def selects(self, labels: Mapping[str, str]) -> bool:
        """Whether the last valid spec selects a pod with `labels` (True before the first)."""
        return self.selector is None or self.selector.matches(labels)

    def stop(self) -> None:
        self.metrics.forget_model(self.namespace, self.name)
        self.picker.stop()
        for engine in self.memory.engines.values():
            engine.stop()

    async def cycle(self) -> None:
        """One look at the model, in six steps: validate its spec, select its pods, observe
        their engines, decide, act, report."""
        self._idle_deadline = None
        now = time.time()
        valid = await self._validate(now)
        if valid is None:
            return
        spec, workload = valid
        chosen = self._select(spec)
        views = await self.views.see(spec, chosen.pods, now)
        await self._picked(spec, workload, chosen.pods, views, now)
        plan = self._decide(spec, workload, chosen.pods, views, now)
        replicas, waiting = await self._act(spec, plan, chosen.pods, views, now)
        await self.executor.gates.reconcile(chosen.pods, self.memory)
        await self._report(spec, chosen, replicas=replicas, waiting=waiting, now=now)

    async def _validate(self, now: float) -> tuple[InferenceModelSpec, Workload | None] | None:
        """The spec, and the workload it scales, if both are valid; else the status says why
        (and the cycle ends there)."""
        generation = self.body.get("metadata", {}).get("generation")
        self.memory.generation = generation
        parsed = self.spec_memo.validate(dict(self.body.get("spec") or {}))
        if isinstance(parsed, SpecError):
            await self.reporter.invalid(str(parsed), generation, now)
            return None
        spec = parsed
        workload = await self.scaler.workload(spec)
        target = spec.scale_target_ref
        if workload is not None and target is not None:
            problem = claims.workload_problem(
                spec.selector,
                kind=target.kind,
                name=target.name,
                template_labels=workload.template_labels,
            )
            if problem is not None:
                await self.reporter.invalid(problem, generation, now)
                return None
        self.reporter.valid()
        self.metrics.set_engine_kind(self.namespace, self.name, spec.engine.kind)
        return spec, workload

    def _select(self, spec: InferenceModelSpec) -> Selection:
        """The pods the selector matches, and of those the ones this loop acts on."""
        self.selector = spec.selector
        chosen = self.chooser.choose(spec)
        self.memory.forget_missing(chosen.selected)
        self.spec, self.selected = spec, chosen.pods
        return chosen

    def _decide(
        self,
        spec: InferenceModelSpec,
        workload: Workload | None,
        pods: list[PodInfo],
        views: list[sleep_policy.EngineView],
        now: float,
    ) -> Plan:
        """What the policy says of each engine now."""
        written = wakerequest.requested_at(self.body)
        # A queue at an endpoint picker asks for a wake as the gateway's annotation does.
        wake_requested = _latest(written, self.picker.asked)
        # Keep-awake windows, pre-wake and idle.after: Auto speak through the spec and the wake
        # request that the decisions read.
        ready = [v for v in views if v.ready]
        asleep = self.memory.scaled_from is not None or (
            bool(ready)
            and all(v.label is EngineState.ASLEEP and not v.action_running for v in ready)
        )
        decided, wake_requested = self.foresight.decide(
            spec, memory=self.memory, wake_requested=wake_requested, asleep=asleep, now=now
        )
        # The engines it can have: its pods, or the replicas it has or will get back.
        kept = 0 if workload is None or workload.replicas is None else workload.replicas
        can_have = max(len(pods), kept, self.memory.scaled_from or 0)
        decided = schedule_policy.bounded(decided, can_have)
        self.min_awake_now = decided.min_awake
        model = sleep_policy.ModelView(
            spec=decided,
            wake_requested=wake_requested,
            now=now,
            sleep_grace=sleep_timeout(spec, self.settings),
        )
        self._idle_deadline = sleep_policy.next_idle_deadline(views, model)
        # Its pods are there (a model at zero is scaled up by the request), and a wake since
        # answered it.
        answered = (
            self.memory.scaled_from is None
            and bool(views)
            and sleep_policy.answered_request(views, replace(model, wake_requested=written))
        )
        return Plan(
            decided=decided,
            wake_requested=wake_requested,
            actions=sleep_policy.decide(views, model),
            replicas=None if workload is None else workload.replicas,
            answered=wakerequest.annotation(self.body) if answered else None,
        )

    async def _act(
        self,
        spec: InferenceModelSpec,
        plan: Plan,
        pods: list[PodInfo],
        views: list[sleep_policy.EngineView],
        now: float,
    ) -> tuple[int | None, str | None]:
        """Start the engines' actions, ask the pools for room, scale the workload: the
        replicas it has now, and why a wake waits (if one does)."""
        if plan.answered is not None:
            await self.clearer.clear(plan.answered)
        by_name = {p.name: p for p in pods}
        labelling = []
        for action in plan.actions:
            if action.kind is not sleep_policy.ActionKind.ASK_ROOM:
                task = self.executor.start(action, by_name[action.pod], spec)
                if task is not None and action.kind is sleep_policy.ActionKind.LABEL:
                    labelling.append(task)
        waiting = self.asks.ask(spec, pods, plan.actions, views, now)
        replicas = plan.replicas
        # Scaling is decided once the actions have started: it reads what they began.
        scale = self.scaler.view(
            plan.decided, views, replicas=replicas, wake_requested=plan.wake_requested, now=now
        )
        decision = scale_policy.decide_scale(scale)
        if decision is not None:
            await self.scaler.apply(decision, spec)
            if decision.kind is scale_policy.ScaleKind.UP:
                replicas = decision.replicas
        if labelling:
            # A label is one pod patch: the status written once it is on says so, where one
            # written now would say "unknown" and need a second write (every model wrote its
            # status twice at start-up).
            await asyncio.wait(labelling, timeout=self.settings.probe_timeout)
        return replicas, waiting

    async def _report(
        self,
        spec: InferenceModelSpec,
        chosen: Selection,
        *,
        replicas: int | None,
        waiting: str | None,
        now: float,
    ) -> None:
        """Write the status (when it changed, or is due)."""
        # Counted as the status counts (after the labels above): a status saying Awake after a
        # scale-up then also carries the wake's duration.
        awake = sum(
            1
            for p in chosen.pods
            if p.ready and status.operator_view(self.memory, p) is EngineState.AWAKE
        )
        self.scaler.check_cold_start(spec, awake, now)
        await self.reporter.write(
            spec,
            chosen.selected,
            self.memory.generation,
            now,
            replicas=replicas,
            conflicts=chosen.conflicts,
            waiting=waiting,
            picker=self.picker.condition(),
        )

    async def _picked(
        self,
        spec: InferenceModelSpec,
        workload: Workload | None,
        pods: list[PodInfo],
        views: list[sleep_policy.EngineView],
        now: float,
    ) -> None:
        """Follow the endpoint pickers of the pools that serve the model (those that select its
        pods, or at zero the pods its workload will make), and act on what they queue for it
        (operator/traffic/pickerwake.py)."""
        self.picker.follow(
            pods=pods,
            template=workload.template_labels if workload is not None else None,
            model_name=spec.model_name or self.name,
            poke=self.poke,
        )
        await self.picker.act(
            spec,
            memory=self.memory,
            pods=pods,
            views=views,
            annotated=wakerequest.requested_at(self.body),
            now=now,
        )


def _latest(*times: float | None) -> float | None:
    return max((t for t in times if t is not None), default=None)
