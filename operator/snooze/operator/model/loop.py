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

from snooze.api.eventreasons import RESOLVED, EventReason
from snooze.api.models import (
    EngineState,
    InferenceModelSpec,
    LabelSelector,
    SpecError,
    SpecMemo,
)
from snooze.api.modelstatus import parse_status
from snooze.api.quantities import format_gib
from snooze.api.reasons import FailureReason
from snooze.engine.client import EngineHttp
from snooze.engine.probe import Prober
from snooze.kube.api import KubeApi
from snooze.kube.pods import PodInfo
from snooze.operator.memory import EngineMemory, Integrity, ModelMemory, process_of, rebuild
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.model import sglangops, wakerequest
from snooze.operator.model.actions import Emit, Executor, engine_url
from snooze.operator.model.foresight import Foresight
from snooze.operator.model.knownbugs import conduct_of, facts_of, learn_versions
from snooze.operator.model.observe import Probe, first_try, note_answer, note_reachability, probe
from snooze.operator.model.pickerwake import PickerWaker
from snooze.operator.model.reporter import StatusReporter
from snooze.operator.model.scaling import Scaler, Workload
from snooze.operator.pool.loop import PoolHub
from snooze.operator.pool.snapshot import ModelSnapshot, take_snapshot
from snooze.operator.settings import Settings, sleep_timeout
from snooze.operator.status import model as status
from snooze.operator.traffic.pickers import PickerQueues
from snooze.policy import claims, probing
from snooze.policy import scale as scale_policy
from snooze.policy import schedule as schedule_policy
from snooze.policy import sleep as sleep_policy
from snooze.policy.brakes import Pace
from snooze.policy.claims import Claim
from snooze.policy.knownbugs import SGLANG
from snooze.policy.pool.books import Directive
from snooze.policy.releases import awake_gauge_believed, sleep_running
from snooze.policy.runs import Process

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Neighbours:
    """What a model's loop may know of the other models (from kopf indices, no API calls)."""

    claims: Callable[[str], Iterable[Claim]]
    """Every valid model's claim on a model name, in any namespace."""
    selectors: Callable[[str, Mapping[str, str]], Iterable[tuple[str, LabelSelector]]]
    """(name, selector) of the valid models in a namespace that may select a pod with these
    labels (at least every one that does)."""


@dataclass(frozen=True)
class Selection:
    """The pods a cycle works on."""

    selected: list[PodInfo]
    """Every pod the selector matches."""
    pods: list[PodInfo]
    """Those this model acts on: not shared with another model."""
    conflicts: status.Conflicts


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
NO_NEIGHBOURS = Neighbours(claims=lambda _: (), selectors=lambda _, __: ())


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
        self.neighbours = neighbours
        self.pools = pools or PoolHub()
        self.traffic = traffic
        """An engine's requests through the gateway (operator/traffic/gateways.py), None if
        unknown."""
        self.spec: InferenceModelSpec | None = None
        """The last valid spec (for the GPU pool this model's engines are members of)."""
        self.selected: list[PodInfo] = []
        """The pods this loop acts on, as of its last cycle."""
        self._asked: set[str] = set()
        """The pools this model asked room of at its last cycle."""
        self.cycled = False
        """Its first cycle has run: its pods are known (a GPU pool waits for every model's)."""
        self.min_awake_now = 0
        """The engines it keeps awake now (minAwake, or a keep-awake window's, bounded by the
        engines it can have): its GPU pool puts none of them to sleep for a neighbour."""
        self._idle_deadline: float | None = None
        """When an awake engine's idle.after ends, if before the next regular cycle could see
        it (policy/sleep.py next_idle_deadline): the loop's next cycle comes then."""
        self._mismatched: set[str] = set()
        """Pods told (once) to be in another pool than spec.pool.name says."""
        self._pool_seen: tuple[Any, ...] = ()
        self._conflicts: dict[EventReason, str] = {}
        """The conflicts (kind -> message) last reported by Event, so each is told once."""
        self.metrics = metrics
        self.name = name
        self.body = body  # kopf's live view: it follows the resource as it changes
        self.pods = pods
        self.api = api
        self.prober = prober
        self.settings = settings
        self.pace = Pace.of(settings.probe_interval)
        """How fast the claims of an engine that contradicts itself are believed."""
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
        self._no_pods = False
        """A NoPods Event was posted and no pod has matched since."""
        self.selector: LabelSelector | None = None
        self.model_name = ""
        """The model name of the last valid spec, for neighbours to find this loop by."""

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
        views = await self._observe(spec, chosen.pods, now)
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
        selected = [p for p in self.pods(spec.selector) if spec.selector.matches(p.labels)]
        self._tell_no_pods(spec, selected)
        self.memory.forget_missing(selected)
        conflicts = self._conflicts_of(spec, selected)
        # A pod two models select is acted on by neither: each would undo what the other did.
        pods = [p for p in selected if p.name not in conflicts.shared]
        self.spec, self.selected = spec, pods
        return Selection(selected=selected, pods=pods, conflicts=conflicts)

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
        waiting = self._ask_pools(pods, plan.actions, views, now)
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
        (operator/model/pickerwake.py)."""
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

    def _ask_pools(
        self,
        pods: list[PodInfo],
        actions: list[sleep_policy.Action],
        views: list[sleep_policy.EngineView],
        now: float,
    ) -> str | None:
        """Tell each GPU pool which of this model's members ask for room (withdrawing the
        rest), poke it when its members changed, and say why a wake (or a start) waits, if
        one does."""
        asking = {a.pod for a in actions if a.kind is sleep_policy.ActionKind.ASK_ROOM}
        by_pool: dict[str, set[str]] = {}
        members: dict[str, set[str]] = {}  # a member that starts waits for room too
        missing: set[str] = set()
        for pod in pods:
            name, loop = self.pools.pool_of(self.namespace, pod, self.spec)
            if name is None:
                continue
            declared = self.spec.pool.name if self.spec and self.spec.pool else None
            if declared is not None and name != declared and pod.name not in self._mismatched:
                self._mismatched.add(pod.name)
                self.emit(
                    "Warning",
                    EventReason.POOL_MISMATCH,
                    f"{pod.name} is a member of GPUPool {name} (its snooze.dev/pool label or "
                    f"ResourceClaim says so), not of {declared} as spec.pool.name says: "
                    "make them agree",
                )
            if loop is None:
                if pod.name in asking:
                    missing.add(name)
                continue
            by_pool.setdefault(name, set())
            members.setdefault(name, set()).add(pod.name)
            if pod.name in asking:
                by_pool[name].add(pod.name)
        for name in self._asked - set(by_pool):
            gone = self.pools.loops.get((self.namespace, name))
            if gone is not None:
                gone.ask(self.name, (), now)
        self._asked = set(by_pool)
        # What the pools read of these members: a change must poke them, which otherwise look
        # again only once per interval. A pod scheduled onto its node is one: Pending, it
        # holds nothing on the device and the pool leaves it out; once there, it starts.
        scheduled = {p.name: p.scheduled for p in pods}
        seen = tuple(
            (v.pod, scheduled.get(v.pod), v.ready, v.label, v.sleeping, v.busy, v.action_running)
            for v in views
            if v.pooled
        )
        for name, asks in by_pool.items():
            loop = self.pools.loops[(self.namespace, name)]
            loop.ask(self.name, asks, now)
            if seen != self._pool_seen:
                loop.poke()
        self._pool_seen = seen
        if missing:
            return (
                f"GPUPool {', '.join(sorted(missing))} not found in namespace "
                f"{self.namespace}: its members wake only once it exists"
            )
        for name, pods_in_pool in members.items():
            wait = self.pools.loops[(self.namespace, name)].waiting_for(pods_in_pool)
            if wait is not None:
                return f"waiting for {format_gib(wait.need)} on GPUPool {name}: {wait.reason}"
        return None

    def _tell_no_pods(self, spec: InferenceModelSpec, selected: list[PodInfo]) -> None:
        """A selector that matches no pod is said once (and its end), not at every probe."""
        at_zero = self.memory.scaled_from is not None or self.memory.scale_up_time is not None
        if not selected and not self._no_pods and not at_zero:
            selector = spec.selector.to_label_selector()
            self.emit(
                "Warning", EventReason.NO_PODS, status.no_pods_message(selector, self.namespace)
            )
            self._no_pods = True
        elif selected and self._no_pods:
            self.emit(
                "Normal", EventReason.PODS_FOUND, f"{len(selected)} pod(s) match the selector now"
            )
            self._no_pods = False

    def _conflicts_of(self, spec: InferenceModelSpec, pods: list[PodInfo]) -> status.Conflicts:
        """Whether another model holds this one's model name, and which pods others select too;
        each new conflict (and each one resolved) is told once by an Event."""
        model_name = self.model_name = spec.model_name or self.name
        held_by = claims.holder(self.neighbours.claims(model_name))
        name_taken = held_by is not None and held_by.key != (self.namespace, self.name)
        others = list(
            {
                n: (n, sel)
                for pod in pods
                for n, sel in self.neighbours.selectors(self.namespace, pod.labels)
                if n != self.name
            }.values()
        )
        found = status.Conflicts(
            model_name=model_name,
            name_taken=name_taken,
            shared=claims.shared_pods({p.name: p.labels for p in pods}, others),
        )
        for kind, message in (
            (EventReason.MODEL_NAME_TAKEN, found.name_message),
            (EventReason.PODS_SHARED, found.shared_message),
        ):
            told = self._conflicts.get(kind)
            if message and message != told:
                self.emit("Warning", kind, message)
                self._conflicts[kind] = message
            elif not message and told:
                self.emit("Normal", RESOLVED[kind], f"resolved: {told}")
                del self._conflicts[kind]
        return found

    async def _observe(
        self, spec: InferenceModelSpec, pods: list[PodInfo], now: float
    ) -> list[sleep_policy.EngineView]:
        # Who is acting, once: a step that ends while the probes below are out must not make
        # its engine look idle with the answer it gave before that step (a finished sleep
        # would look like a drain cut off, and be sent again).
        acting = {p.name for p in pods if self.memory.engine(p.name, now=now).acting}
        targets = [
            p
            for p in pods
            if p.ready
            and p.name not in acting
            and (engine := self.memory.engine(p.name, now=now)) is not None
            and probing.probe_due(
                probing.ProbeFacts(
                    last_probe=engine.last_probe,
                    answered=engine.probe_failures == 0,
                    sleeping=engine.sleeping,
                    label=engine.label_of(p),
                    direct_activity=engine.direct_activity,
                    last_activity=engine.last_activity,
                    followed=spec.pool is not None and self.traffic(self.namespace, p.name) is None,
                ),
                idle_after=spec.idle_after_seconds,
                now=now,
                interval=self.settings.probe_interval,
                drift=self.settings.drift_interval,
            )
        ]
        probes = await asyncio.gather(
            *(self._probe(spec, p, self.memory.engine(p.name, now=now)) for p in targets)
        )
        results = {p.pod: p for p in probes}
        probed_at = time.time()  # the answers are no older than this
        port = spec.engine.port
        learning = [
            (p, engine, process)
            for p in pods
            if p.ready
            and p.name not in acting
            and (engine := self.memory.engine(p.name, now=now)).answered
            and (process := process_of(p, port)) is not None
        ]
        if spec.engine.kind == SGLANG:
            urls = [(engine_url(spec, p), e, process) for p, e, process in learning]
            await sglangops.learn_server_info(self.executor.http, urls)
        else:
            await learn_versions(
                self.executor.http,
                [(engine_url(spec, p), e, r, facts_of(p, e, r)) for p, e, r in learning],
            )
        views = []
        for pod in pods:
            engine = self.memory.engine(pod.name, now=now)
            process = process_of(pod, port)
            _new_run(self.memory, pod.name, engine, process)
            if engine.sleep_blocked and engine.sleep_blocked != (pod.uid, self.memory.generation):
                # A new pod under this name, or a new spec: worth one more try.
                engine.sleep_blocked, engine.sleep_failures = None, 0
                engine.last_sleep_failure = None
                engine.sleep_failure_reason = engine.sleep_failure_message = ""
            result = results.get(pod.name)
            if result is not None:
                note_reachability(pod.name, engine, result, self.emit)
            told = note_answer(
                self.memory,
                engine,
                pod,
                spec,
                result,
                traffic=self.traffic(self.namespace, pod.name),
                probed_at=probed_at,
                now=now,
                pace=self.pace,
            )
            if told is not None:
                self.emit("Warning", EventReason.ENGINE_CONTRADICTS, f"{pod.name}: {told}")
            pool_name, pool = self.pools.pool_of(self.namespace, pod, spec)
            directive = pool.directive(pod.name) if pool is not None else Directive()
            if spec.engine.kind == SGLANG:
                sglangops.note_refusal(pod, engine, process, self.memory.generation, self.emit)
                facts = sglangops.serve_facts(engine, process)
            else:
                facts = facts_of(pod, engine, process)
            conduct = conduct_of(spec, facts, directive.level)
            engine.conduct = conduct
            views.append(
                sleep_policy.EngineView(
                    pod=pod.name,
                    ready=pod.ready and not engine.deleted,
                    label=engine.label_of(pod),
                    # Not probed this cycle: what it last said (nothing it needs to say has
                    # changed since; see policy/probing.py).
                    sleeping=engine.sleeping if pod.ready else None,
                    busy=engine.busy,
                    last_activity=engine.last_activity,
                    action_running=pod.name in acting,
                    sleep_started=engine.sleep_started_of(pod),
                    woke_at=engine.woke_at,
                    sleep_sent=pod.sleep_sent,
                    sleep_running=sleep_running(engine.sleeps_in_flight, facts.release),
                    wake_failures=engine.wake_failures,
                    last_failure=engine.last_failure,
                    last_failure_reason=engine.last_failure_reason,
                    pooled=pool_name is not None,
                    pool_grant=directive.grant,
                    pool_evict=directive.evict,
                    pool_headroom=directive.headroom,
                    pool_rewake=directive.rewake,
                    pool_promised=directive.promised,
                    pool_level=directive.level,
                    pool_restart=directive.restart,
                    sleep_level=(engine.sleep_level or pod.sleep_level) or None,
                    sleep_failures=engine.sleep_failures,
                    last_sleep_failure=engine.last_sleep_failure,
                    sleep_blocked=engine.sleep_blocked is not None or conduct.level is None,
                    fallback_level=conduct.level,
                    drained_only=conduct.drained_only,
                    quarantined=engine.integrity.quarantined and engine.integrity.of(process),
                )
            )
        return views

    async def _probe(self, spec: InferenceModelSpec, pod: PodInfo, engine: EngineMemory) -> Probe:
        if spec.engine.kind == SGLANG:
            return await self._probe_sglang(spec, pod, engine)
        port = spec.engine.port
        result = await probe(
            self.prober,
            engine_url(spec, pod),
            pod.name,
            share_known=engine.gpu_share is not None,
            # An engine that never answered is unlabelled, so unroutable: its first probe goes
            # before the routine probes of engines already published.
            urgent=first_try(engine),
            # Models take turns: one with many slow engines delays this one by a turn at most.
            owner=(self.namespace, self.name),
            confirm_awake=engine.label_of(pod) in DOUBTED
            and not awake_gauge_believed(facts_of(pod, engine, process_of(pod, port)).release),
        )
        if result.reason:
            self.metrics.probe_failures.labels(self.namespace, self.name, result.reason).inc()
        return result

    async def _probe_sglang(
        self, spec: InferenceModelSpec, pod: PodInfo, engine: EngineMemory
    ) -> Probe:
        """As _probe, for an SGLang server: asleep is what its pod says was released."""
        result = await sglangops.probe(
            self.prober,
            engine_url(spec, pod),
            pod.name,
            outstanding=sglangops.outstanding_of(pod, process_of(pod, spec.engine.port)),
            urgent=first_try(engine),
            owner=(self.namespace, self.name),
        )
        if result.reason:
            self.metrics.probe_failures.labels(self.namespace, self.name, result.reason).inc()
        return result


def _latest(*times: float | None) -> float | None:
    return max((t for t in times if t is not None), default=None)


# Labels under which an engine's gauge saying awake is asked again of /is_sleeping, on the
# releases where a partial wake reads awake there (policy/releases.py).
DOUBTED = (EngineState.ASLEEP, EngineState.WAKING, EngineState.FAILED)


def _new_run(memory: ModelMemory, pod: str, engine: EngineMemory, process: Process) -> None:
    """A new run of an engine (its container restarted) is checked afresh: its records were
    of the run before, and so was a quarantine for answering differently."""
    if engine.integrity.process is None or engine.integrity.of(process):
        return
    engine.integrity = Integrity(process=process)
    if engine.last_failure_reason in (
        FailureReason.OUTPUT_MISMATCH,
        FailureReason.WEIGHTS_MISMATCH,
    ):
        engine.wake_failures, engine.last_failure = 0, None
        engine.last_failure_reason = engine.last_failure_message = ""
        if memory.failure is not None and memory.failure[0] == pod:
            memory.failure = None
