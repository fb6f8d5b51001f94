"""What one cycle sees of a model's engines: it probes those due (none that a step of its own
is acting on), learns each run's release or server arguments once, and builds, from what
it knows of each engine, the views the policy decides on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from snooze.api.eventreasons import EventReason
from snooze.api.models import EngineState, InferenceModelSpec
from snooze.api.reasons import FailureReason
from snooze.engine.client import EngineHttp
from snooze.engine.probe import Prober
from snooze.kube.pods import PodInfo
from snooze.operator.events.emit import Emit
from snooze.operator.memory import EngineMemory, Integrity, ModelMemory, process_of
from snooze.operator.metrics import OperatorMetrics
from snooze.operator.model import sglangops
from snooze.operator.model.actions import engine_url
from snooze.operator.model.knownbugs import conduct_of, facts_of, learn_versions, sleeps_at
from snooze.operator.model.observe import Probe, first_try, note_answer, note_reachability, probe
from snooze.operator.pool.loop import PoolHub
from snooze.operator.settings import Settings
from snooze.policy import probing
from snooze.policy import sleep as sleep_policy
from snooze.policy.brakes import Pace
from snooze.policy.knownbugs import SGLANG
from snooze.policy.pool.books import Directive
from snooze.policy.releases import awake_gauge_believed, sleep_running
from snooze.policy.runs import Process


class EngineViews:
    """One model's engines as its cycles see them."""

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        memory: ModelMemory,
        prober: Prober,
        http: EngineHttp,
        settings: Settings,
        traffic: Callable[[str, str], probing.Traffic | None],
        pools: PoolHub,
        emit: Emit,
        metrics: OperatorMetrics,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.memory = memory
        self.prober = prober
        self.http = http
        self.settings = settings
        self.traffic = traffic
        """An engine's requests through the gateway (operator/traffic/gateways.py), None if
        unknown."""
        self.pools = pools
        self.emit = emit
        self.metrics = metrics
        self.pace = Pace.of(settings.probe_interval)
        """How fast the claims of an engine that contradicts itself are believed."""

    async def see(
        self, spec: InferenceModelSpec, pods: list[PodInfo], now: float
    ) -> list[sleep_policy.EngineView]:
        """Each pod's engine as the policy reads it, after this cycle's probes."""
        # Who is acting, once: a step that ends while the probes below are out must not make
        # its engine look idle with the answer it gave before that step (a finished sleep
        # would look like a drain cut off, and be sent again).
        acting = {p.name for p in pods if self.memory.engine(p.name, now=now).acting}
        stalls = {p.name: self._stall_count(p) for p in pods}
        stalled = set()
        for p in pods:
            engine = self.memory.engine(p.name, now=now)
            # A count below the one seen at its last probe: a replica restarted; seen afresh.
            engine.stalls_seen = min(engine.stalls_seen, stalls[p.name])
            if stalls[p.name] > engine.stalls_seen:
                stalled.add(p.name)
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
                    stalled=p.name in stalled,
                ),
                idle_after=spec.idle_after_seconds,
                now=now,
                interval=self.settings.probe_interval,
                drift=self.settings.drift_interval,
            )
        ]
        probes = await asyncio.gather(
            *(
                self._probe(spec, p, self.memory.engine(p.name, now=now), stalled=p.name in stalled)
                for p in targets
            )
        )
        for p in targets:
            self.memory.engine(p.name, now=now).stalls_seen = stalls[p.name]
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
            await sglangops.learn_server_info(self.http, urls)
        else:
            await learn_versions(
                self.http,
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
                sglangops.note_level(
                    pod, engine, process, spec.sleep.level, self.memory.generation, self.emit
                )
                facts = sglangops.serve_facts(engine, process)
            else:
                facts = facts_of(pod, engine, process)
            conduct = conduct_of(spec, facts, directive.level)
            engine.conduct, engine.sleeps_at = conduct, sleeps_at(spec, facts)
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

    def _stall_count(self, pod: PodInfo) -> float:
        """The gateways' count of the engine's stalls now (0 where no gateway counts)."""
        traffic = self.traffic(self.namespace, pod.name)
        return traffic.stalls if traffic is not None else 0.0

    async def _probe(
        self, spec: InferenceModelSpec, pod: PodInfo, engine: EngineMemory, *, stalled: bool
    ) -> Probe:
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
            # Found stuck by a gateway: its gauge's awake may be a lie, /is_sleeping is not.
            confirm_awake=stalled
            or (
                engine.label_of(pod) in DOUBTED
                and not awake_gauge_believed(facts_of(pod, engine, process_of(pod, port)).release)
            ),
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
