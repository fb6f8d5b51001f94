"""The operator's Prometheus metrics, all in one place: names, units, labels and buckets.

Labels stay bounded: namespace, model, pod, level, state, phase and a failure reason from a
closed set; never a request or an error message.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from snooze import __version__
from snooze.api.models import EngineState, Phase
from snooze.policy.pool.types import RoomKind

# From one short greedy request (tens of milliseconds) to the weights of a large model hashed
# on the host (minutes).
VERIFICATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0, 600.0)
# From a fast level-1 wake (0.1 s) to a cold reload (minutes).
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# A cycle is a few probes on a quiet operator (milliseconds), seconds on a saturated one.
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STATES = [state.value for state in EngineState]
# A model's series are born at its first event, not created at zero for every model and
# reason: at a thousand models the zeros were megabytes of page (benchmarks/README.md, scrape
# cost). The first event of a series is then invisible to rate() and increase(); the alert
# rules that must see it (SnoozeWakeFailures) also match series that did not exist earlier.
# Why a pool put a member to sleep (policy.pooltypes.RoomKind): room for another member's
# wake, for one starting, to make its books good (a member whose sleep frees nothing counts
# whole), room kept ahead of wakes (a pool's headroom), or its first level-1 sleep done ahead
# of need (a pool's prime: it is woken back at once).
POOL_EVICTION_REASONS = tuple(kind.value for kind in RoomKind)

# `_created` samples double every counter's and histogram's series and no panel or rule
# reads them: at a thousand models the page is megabytes, scraped every few seconds.
disable_created_metrics()  # type: ignore[no-untyped-call]


@dataclass(frozen=True, kw_only=True)
class Wake:
    at: float
    namespace: str
    model: str
    seconds: float


@dataclass(frozen=True, kw_only=True)
class PoolWait:
    at: float
    namespace: str
    pool: str
    model: str
    seconds: float


class _ModelsByPhase(Collector):
    """`snooze_models{phase}`: how many models are in each phase, counted at scrape time."""

    def __init__(self) -> None:
        self.phases: dict[tuple[str, str], str] = {}

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("snooze_models", "InferenceModels by phase.", labels=["phase"])
        for phase in Phase:
            count = sum(1 for value in self.phases.values() if value == phase.value)
            family.add_metric([phase.value], count)
        yield family


class OperatorMetrics:
    """Every metric the operator exports, on a registry of its own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.wake_duration = Histogram(
            "snooze_wake_duration_seconds",
            "Time from the start of a wake to the engine confirming it is awake.",
            ["namespace", "model", "level"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        # Per namespace, not per model: a model's sleeps are its Events; a histogram per model
        # would be a page of buckets per thousand models (wakes keep theirs: they are what
        # clients wait for).
        self.sleep_duration = Histogram(
            "snooze_sleep_duration_seconds",
            "Time from the start of a drain to the engine confirming it sleeps.",
            ["namespace", "level"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.wake_failures = Counter(
            "snooze_wake_failures_total",
            "Failed wakes, by reason (HybridKVCacheReinit, Timeout, Unreachable, EngineError, "
            "OutputMismatch, WeightsMismatch...).",
            ["namespace", "model", "reason"],
            registry=r,
        )
        self.verifications = Counter(
            "snooze_wake_verifications_total",
            "Checks of woken engines: check is output (the greedy answer) or weights (their "
            "digests); result is passed, failed (the engine is not routed to) or unverifiable "
            "(nothing to compare, or the engine could not be asked).",
            ["namespace", "model", "check", "result"],
            registry=r,
        )
        # Per namespace and check, as sleeps: the cost of a check, not one series per model.
        self.verification_duration = Histogram(
            "snooze_wake_verification_seconds",
            "Time one check took: recording before a sleep, or checking after a wake.",
            ["namespace", "check"],
            buckets=VERIFICATION_BUCKETS,
            registry=r,
        )
        self.sleep_failures = Counter(
            "snooze_sleep_failures_total",
            "Failed sleeps, by reason.",
            ["namespace", "model", "reason"],
            registry=r,
        )
        self.restarts = Counter(
            "snooze_pod_restarts_total",
            "Pods deleted so that their controller recreates them (wake.onFailure: Restart).",
            ["namespace", "model", "reason"],
            registry=r,
        )
        self.engine_state = Gauge(
            "snooze_engine_state",
            "1 for each engine, labelled with its current published state (one series per "
            "engine: a state it is not in has no series).",
            ["namespace", "model", "pod", "state"],
            registry=r,
        )
        self.model_engine = Gauge(
            "snooze_model_engine_info",
            "1 for each model, labelled with its engines' kind (spec.engine.kind: vllm or "
            "sglang): join on namespace and model to split any model's series by engine.",
            ["namespace", "model", "engine"],
            registry=r,
        )
        self.asleep_seconds = Counter(
            "snooze_asleep_seconds_total",
            "Engine-seconds spent asleep: the GPU time given back.",
            ["namespace", "model"],
            registry=r,
        )
        self.tier_transitions = Counter(
            "snooze_tier_transitions_total",
            "Transitions between tiers: Asleep and Awake per engine, ScaledToZero and "
            "ScalingUp per workload.",
            ["namespace", "model", "tier"],
            registry=r,
        )
        # Unlabelled on purpose: one histogram for the whole fleet, not one per model.
        self.cycle_duration = Histogram(
            "snooze_model_cycle_duration_seconds",
            "Time one model's cycle takes: probe its engines, decide, start actions, write "
            "status. Above the probe interval, probes fall behind.",
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self.reconcile_errors = Counter(
            "snooze_reconcile_errors_total",
            "Cycles of a model's loop that ended in an unexpected error.",
            ["namespace", "model"],
            registry=r,
        )
        self.probe_failures = Counter(
            "snooze_probe_failures_total",
            "Probes of an engine that got no usable answer, by reason (Unreachable, Timeout, "
            "AnswerTooLarge, InvalidAnswer, EngineError, SleepModeDisabled).",
            ["namespace", "model", "reason"],
            registry=r,
        )
        # Unlabelled by replica: replicas come and go with the gateway's rollouts.
        self.gateway_scrape_failures = Counter(
            "snooze_gateway_scrape_failures_total",
            "Scrapes of a gateway replica's counters that could not be used, by reason "
            "(Unreachable, Timeout, HTTPError, AnswerTooLarge, InvalidAnswer).",
            ["reason"],
            registry=r,
        )
        self.pool_memory = Gauge(
            "snooze_pool_memory_bytes",
            "A GPU pool's device memory: held by awake (waking, draining, starting) members, "
            "held by asleep ones (what sleep cannot free), and free.",
            ["namespace", "pool", "state"],
            registry=r,
        )
        self.pool_awake_members = Gauge(
            "snooze_pool_awake_members",
            "A GPU pool's members awake now (as its coordinator counts them).",
            ["namespace", "pool"],
            registry=r,
        )
        self.pool_waiting_wakes = Gauge(
            "snooze_pool_waiting_wakes",
            "Wakes of a GPU pool's members waiting for room on it.",
            ["namespace", "pool"],
            registry=r,
        )
        self.pool_overcommitted = Gauge(
            "snooze_pool_overcommitted",
            "1 while a GPU pool's Overcommitted condition is True: its members' footprints "
            "cannot be met even with all but one asleep.",
            ["namespace", "pool"],
            registry=r,
        )
        self.pool_evictions = Counter(
            "snooze_pool_evictions_total",
            "Pool members put to sleep to make room: for a wake, for a member starting, to "
            "make the pool's books good (books), ahead of wakes (headroom), or to pin a host "
            "copy ahead of need (prime).",
            ["namespace", "pool", "reason"],
            registry=r,
        )
        self.pool_wait = Histogram(
            "snooze_pool_wait_seconds",
            "How long a member's wake waited for room on its pool (ask to grant).",
            ["namespace", "pool"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.pool_oom = Counter(
            "snooze_pool_oom_total",
            "Wakes of pool members that failed for want of device memory (CUDA out of memory): "
            "0 while the pool's accounting holds.",
            ["namespace", "pool"],
            registry=r,
        )
        self.prewakes = Counter(
            "snooze_prewakes_total",
            "Wakes of a sleeping model ahead of the requests its weekly profile expects.",
            ["namespace", "model"],
            registry=r,
        )
        self.prewake_hits = Counter(
            "snooze_prewake_hits_total",
            "Pre-wakes that a request followed within their slot.",
            ["namespace", "model"],
            registry=r,
        )
        self.prewake_misses = Counter(
            "snooze_prewake_misses_total",
            "Pre-wakes that no request followed: each one weakens its slot of the profile.",
            ["namespace", "model"],
            registry=r,
        )
        self.window_active = Gauge(
            "snooze_keepawake_window_active",
            "1 while a keep-awake window of spec.schedule is in force, else 0.",
            ["namespace", "model"],
            registry=r,
        )
        self.build_info = Info("snooze_operator_build", "The operator's version.", registry=r)
        self.build_info.info({"version": __version__})
        self.models = _ModelsByPhase()
        r.register(self.models)
        self._pods: dict[tuple[str, str], dict[str, str | None]] = {}
        self._kinds: dict[tuple[str, str], str] = {}
        self.wakes: deque[Wake] = deque(maxlen=10_000)
        """The latest wakes, each exact (a histogram keeps only buckets): for reports such as
        the demo's summary. Bounded, so it costs nothing in a long-running operator."""
        self.pool_waits: deque[PoolWait] = deque(maxlen=10_000)
        """The latest waits for room on a pool, each exact, as `wakes`."""

    def observe_wake(self, namespace: str, model: str, level: str, seconds: float) -> None:
        """One finished wake: into the histogram, and into `wakes` for exact reports."""
        self.wake_duration.labels(namespace, model, level).observe(seconds)
        self.wakes.append(Wake(at=time.time(), namespace=namespace, model=model, seconds=seconds))

    def observe_pool_wait(self, namespace: str, pool: str, model: str, seconds: float) -> None:
        """One wake granted room on its pool after `seconds`: the histogram, and `pool_waits`."""
        self.pool_wait.labels(namespace, pool).observe(seconds)
        self.pool_waits.append(
            PoolWait(at=time.time(), namespace=namespace, pool=pool, model=model, seconds=seconds)
        )

    def set_engine_states(
        self, namespace: str, model: str, states: Mapping[str, str | None]
    ) -> None:
        """Publish each pod's state as one series; drop those of states left and pods gone.

        One series per engine, not one per possible state: at thousands of engines the zeros
        were most of the page, scraped every few seconds.
        """
        key = (namespace, model)
        before = self._pods.get(key, {})
        for pod, state in before.items():
            if states.get(pod) != state and state is not None:
                with contextlib.suppress(KeyError):
                    self.engine_state.remove(namespace, model, pod, state)
        for pod, state in states.items():
            if state is not None and before.get(pod) != state:
                self.engine_state.labels(namespace, model, pod, state).set(1)
        self._pods[key] = dict(states)

    def set_engine_kind(self, namespace: str, model: str, kind: str) -> None:
        """The model's engine kind, one series (the one of a former kind removed)."""
        before = self._kinds.get((namespace, model))
        if before == kind:
            return
        if before is not None:
            with contextlib.suppress(KeyError):
                self.model_engine.remove(namespace, model, before)
        self.model_engine.labels(namespace, model, kind).set(1)
        self._kinds[(namespace, model)] = kind

    def set_phase(self, namespace: str, model: str, phase: str) -> None:
        self.models.phases[(namespace, model)] = phase

    def start_pool(self, namespace: str, pool: str) -> None:
        """A pool's series at zero, so that the first eviction or OOM shows in rate()."""
        for reason in POOL_EVICTION_REASONS:
            self.pool_evictions.labels(namespace, pool, reason)
        self.pool_oom.labels(namespace, pool)
        self.pool_wait.labels(namespace, pool)

    def set_pool_memory(
        self, namespace: str, pool: str, *, awake: int, asleep: int, free: int
    ) -> None:
        for state, value in (("awake", awake), ("asleep", asleep), ("free", free)):
            self.pool_memory.labels(namespace, pool, state).set(value)

    def set_pool_members(
        self, namespace: str, pool: str, *, awake: int, waiting: int, overcommitted: bool
    ) -> None:
        self.pool_awake_members.labels(namespace, pool).set(awake)
        self.pool_waiting_wakes.labels(namespace, pool).set(waiting)
        self.pool_overcommitted.labels(namespace, pool).set(1 if overcommitted else 0)

    def forget_pool(self, namespace: str, pool: str) -> None:
        for state in ("awake", "asleep", "free"):
            with contextlib.suppress(KeyError):
                self.pool_memory.remove(namespace, pool, state)
        for gauge in (self.pool_awake_members, self.pool_waiting_wakes, self.pool_overcommitted):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, pool)

    def forget_model(self, namespace: str, model: str) -> None:
        self.set_engine_states(namespace, model, {})
        kind = self._kinds.pop((namespace, model), None)
        if kind is not None:
            with contextlib.suppress(KeyError):
                self.model_engine.remove(namespace, model, kind)
        self._pods.pop((namespace, model), None)
        self.models.phases.pop((namespace, model), None)
        for metric in (self.prewakes, self.prewake_hits, self.prewake_misses, self.window_active):
            with contextlib.suppress(KeyError):
                metric.remove(namespace, model)
