"""A discrete-event simulation of one model's engines under a policy: requests arrive from a
trace, the gateway holds those that find no awake engine and asks for a wake, and the
operator's real decisions (sleep_policy.decide, scale_policy.decide_scale, the schedule and
pre-wake policies) run at every instant where something changes."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import count

from snooze.models import EngineState, InferenceModelSpec
from snooze.policy import prewake as prewake_policy
from snooze.policy import scale as scale_policy
from snooze.policy import schedule as schedule_policy
from snooze.policy import sleep as sleep_policy
from snooze.policy.sleep import ActionKind
from snooze.whatif.latency import Latencies
from snooze.whatif.trace import Request

EPSILON = 1e-6
"""Timers fire this long after their deadline, so that `now - since >= after` holds despite
floating-point rounding."""


@dataclass(kw_only=True)
class Engine:
    pod: str
    label: EngineState = EngineState.AWAKE
    sleeping: bool = False
    present: bool = True
    """The pod exists (False while its workload is scaled to zero)."""
    ready_at: float | None = None
    """A pod scaled up is Ready (its engine loaded, awake) at this time."""
    running: int = 0
    last_activity: float = 0.0
    action: ActionKind | None = None
    sleep_started: float | None = None
    sleep_level: int | None = None
    awake_since: float | None = None
    """The GPU counts as busy from the start of a wake (or a scale-up) to the end of a sleep."""
    pinned: bool = False
    """Its process holds pinned host blocks from an earlier level-1 sleep: the next one only
    copies (a pod scaled up is a new process, with none)."""


@dataclass(kw_only=True)
class Outcome:
    """One model under one policy, counted within the measured span."""

    gpu_seconds_awake: float = 0.0
    gpu_seconds_always_on: float = 0.0
    wakes: int = 0
    cold_starts: int = 0
    requests: int = 0
    held: list[float] = field(default_factory=list)
    """The added latency of each held request."""
    prewakes: int = 0
    prewake_hits: int = 0
    prewake_misses: int = 0


class Simulation:
    """One model, one policy, from the trace's first request to its last answer."""

    def __init__(
        self,
        *,
        spec: InferenceModelSpec,
        requests: Sequence[Request],
        latencies: Latencies,
        engines: int = 1,
        measure_from: float | None = None,
        start: float | None = None,
        end: float | None = None,
    ) -> None:
        self.spec = spec
        self.requests = requests
        self.lat = latencies
        self.start = requests[0].at if start is None else start
        last = max(r.at + self._service(r) for r in requests)
        self.end = last if end is None else max(end, last)
        self.span_end = self.end
        """Always-on is counted to here: the last answer had no request been held."""
        self.measure_from = self.start if measure_from is None else measure_from
        # Engines begin awake and freshly used: the trace starts where traffic was.
        self.engines = [
            Engine(pod=f"engine-{i}", last_activity=self.start, awake_since=self.start)
            for i in range(engines)
        ]
        self.wake_requested: float | None = None
        self.last_activity = self.start
        self.replicas = engines
        self.scaled_from: int | None = None
        self.scaled_at: float | None = None
        self.held: list[Request] = []
        self.learnt = prewake_policy.Learnt(
            profile=prewake_policy.Profile(
                zone=spec.prewake.time_zone if spec.prewake is not None else "UTC"
            )
        )
        self.edges = [e.at for e in schedule_policy.edges(spec.schedule, self.start - 1, self.end)]
        self.out = Outcome()
        self._queue: list[tuple[float, int, str, int]] = []
        self._timers: set[float] = set()
        self._auto: tuple[prewake_policy.GapHistogram, InferenceModelSpec] | None = None
        self._seq = count()

    # --- the clock -----------------------------------------------------------------------

    def run(self) -> Outcome:
        for i, request in enumerate(self.requests):
            self._push(request.at, "arrival", i)
        for edge in self.edges:
            self._push(edge + EPSILON, "timer", -1)
        self._cycle(self.start)
        while self._queue:
            now, _, kind, index = heapq.heappop(self._queue)
            if now > self.end:
                # Past the last arrival, only the answers still owed count.
                owed = self.held or any(e.running or e.action or e.ready_at for e in self.engines)
                if not owed:
                    break
                self.end = now
            if kind == "arrival":
                self._arrive(self.requests[index], now)
            elif kind == "done":
                self._done(self.engines[index], now)
            elif kind == "action":
                self._finish(self.engines[index], now)
            elif kind == "ready":
                self._ready(self.engines[index], now)
            self._cycle(now)
        for engine in self.engines:
            self._close(engine, self.end)
        span = self.span_end - max(self.start, self.measure_from)
        self.out.gpu_seconds_always_on = len(self.engines) * max(span, 0.0)
        return self.out

    def _push(self, at: float, kind: str, index: int) -> None:
        heapq.heappush(self._queue, (at, next(self._seq), kind, index))

    def _measured(self, at: float) -> bool:
        return at >= self.measure_from

    # --- the gateway ---------------------------------------------------------------------

    def _service(self, request: Request) -> float:
        tokens = request.output_tokens
        return self.lat.token_seconds * (self.lat.output_tokens if tokens is None else tokens)

    def _arrive(self, request: Request, now: float) -> None:
        if self._measured(now):
            self.out.requests += 1
        busy = any(e.running for e in self.engines)
        awake = [e for e in self.engines if e.present and e.label is EngineState.AWAKE]
        if self.spec.prewake is not None or self.spec.idle.after == "Auto":
            self._learn(
                self.learnt.request(
                    now, idle_since=None if busy else self.last_activity, found_asleep=not awake
                ),
                now,
            )
        if awake:
            self._serve(request, min(awake, key=lambda e: e.running), now)
            return
        self.held.append(request)
        starting = any(
            e.action is ActionKind.WAKE or (e.present and e.ready_at is not None)
            for e in self.engines
        )
        if not starting:
            self.wake_requested = now  # the gateway's annotation: once per wake

    def _serve(self, request: Request, engine: Engine, now: float) -> None:
        engine.running += 1
        engine.last_activity = self.last_activity = now
        self._push(now + self._service(request), "done", self.engines.index(engine))

    def _done(self, engine: Engine, now: float) -> None:
        engine.running -= 1
        engine.last_activity = self.last_activity = now

    def _release(self, engine: Engine, now: float) -> None:
        held, self.held = self.held, []
        for request in held:
            if self._measured(request.at):
                self.out.held.append(now - request.at)
            self._serve(request, engine, now)

    # --- the engines ---------------------------------------------------------------------

    def _finish(self, engine: Engine, now: float) -> None:
        action, engine.action = engine.action, None
        if action is ActionKind.SLEEP:
            engine.label, engine.sleeping = EngineState.ASLEEP, True
            self._close(engine, now)
        elif action is ActionKind.WAKE:
            engine.label, engine.sleeping, engine.sleep_level = EngineState.AWAKE, False, 0
            # As the operator does: a woken engine starts a fresh idle period.
            engine.last_activity = self.last_activity = now
            self._release(engine, now)

    def _ready(self, engine: Engine, now: float) -> None:
        if not engine.present or engine.ready_at is None:
            return
        engine.ready_at = None
        engine.label, engine.sleeping = EngineState.AWAKE, False
        engine.last_activity = self.last_activity = now
        self._release(engine, now)

    def _open(self, engine: Engine, now: float) -> None:
        if engine.awake_since is None:
            engine.awake_since = now

    def _close(self, engine: Engine, now: float) -> None:
        if engine.awake_since is not None:
            began = max(engine.awake_since, self.measure_from)
            self.out.gpu_seconds_awake += max(0.0, min(now, self.end) - began)
            engine.awake_since = None

    def _start(self, action: sleep_policy.Action, now: float) -> None:
        index = next(i for i, e in enumerate(self.engines) if e.pod == action.pod)
        engine = self.engines[index]
        if action.kind is ActionKind.LABEL and action.label is not None:
            engine.label = action.label
        elif action.kind is ActionKind.SLEEP:
            # Idle: nothing to drain, so /sleep goes out at once and a wake cannot cancel it.
            engine.action, engine.label = ActionKind.SLEEP, EngineState.DRAINING
            engine.sleep_started, engine.sleep_level = now, action.level or 1
            self._push(
                now + self.lat.sleep(engine.sleep_level, pinned=engine.pinned), "action", index
            )
            engine.pinned = engine.pinned or engine.sleep_level == 1
        elif action.kind is ActionKind.WAKE:
            engine.action, engine.label = ActionKind.WAKE, EngineState.WAKING
            self._open(engine, now)
            if self._measured(now):
                self.out.wakes += 1
            self._push(now + self.lat.wake(engine.sleep_level or 1), "action", index)

    # --- the operator --------------------------------------------------------------------

    def _effective(self, now: float) -> InferenceModelSpec:
        gaps = self.learnt.gaps
        if self._auto is None or self._auto[0] is not gaps:
            # The keep-alive changes only when a gap is learnt: choose it once per change.
            self._auto = (gaps, prewake_policy.effective_spec(self.spec, gaps))
        return schedule_policy.with_schedule(self._auto[1], now)

    def _cycle(self, now: float) -> None:
        spec = self._effective(now)
        if self.spec.prewake is not None:
            asleep = not any(
                e.present and (e.label is not EngineState.ASLEEP or e.ready_at is not None)
                for e in self.engines
            )
            learnt, fire = self.learnt.tick(now, lead=self.spec.prewake.lead_seconds, asleep=asleep)
            self._learn(learnt, now)
            if fire:
                self.wake_requested = now
        views = [self._view(e, now) for e in self.engines if e.present and e.ready_at is None]
        model = sleep_policy.ModelView(spec=spec, wake_requested=self.wake_requested, now=now)
        for action in sleep_policy.decide(views, model):
            self._start(action, now)
        self._scale(spec, now)
        self._schedule_timer(spec, now)

    def _learn(self, learnt: prewake_policy.Learnt, now: float) -> None:
        before, self.learnt = self.learnt, learnt
        if self._measured(now):
            self.out.prewakes += learnt.prewakes - before.prewakes
            self.out.prewake_hits += learnt.hits - before.hits
            self.out.prewake_misses += learnt.misses - before.misses

    def _view(self, engine: Engine, now: float) -> sleep_policy.EngineView:
        return sleep_policy.EngineView(
            pod=engine.pod,
            ready=True,
            label=engine.label,
            sleeping=engine.sleeping,
            busy=engine.running > 0,
            last_activity=engine.last_activity,
            action_running=engine.action is not None,
            sleep_started=engine.sleep_started,
            sleep_level=engine.sleep_level if engine.sleeping else None,
        )

    def _scale(self, spec: InferenceModelSpec, now: float) -> None:
        if spec.scale_target_ref is None:
            return
        present = [e for e in self.engines if e.present]
        view = scale_policy.ScaleView(
            spec=spec,
            replicas=self.replicas,
            scaled_from=self.scaled_from,
            scaled_at=self.scaled_at,
            manual_at=None,
            last_activity=self.last_activity,
            all_asleep=bool(present)
            and all(e.label is EngineState.ASLEEP and e.action is None for e in present),
            wake_requested=self.wake_requested,
            now=now,
        )
        decision = scale_policy.decide_scale(view)
        if decision is None:
            return
        if decision.kind is scale_policy.ScaleKind.TO_ZERO:
            self.scaled_from, self.scaled_at, self.replicas = decision.replicas, now, 0
            for engine in self.engines:
                engine.present = False
        elif decision.kind is scale_policy.ScaleKind.UP:
            self.scaled_from, self.scaled_at, self.replicas = None, None, decision.replicas
            if self._measured(now):
                self.out.cold_starts += 1
            for index, engine in enumerate(self.engines[: decision.replicas]):
                engine.present, engine.ready_at = True, now + self.lat.cold_start_seconds
                engine.label, engine.sleeping, engine.sleep_started = (
                    EngineState.WAKING,
                    False,
                    None,
                )
                engine.sleep_level, engine.pinned = None, False
                self._open(engine, now)
                self._push(engine.ready_at, "ready", index)

    def _schedule_timer(self, spec: InferenceModelSpec, now: float) -> None:
        """The next instant a decision may change without an event: an idle period or a
        wake request's quiet time running out, a tier's delay, a pre-wake, a held request's
        timeout."""
        times: list[float] = []
        idle = spec.idle_after_seconds
        for engine in self.engines:
            if engine.present and engine.label is EngineState.AWAKE and not engine.running:
                times.append(engine.last_activity + idle)
        if self.wake_requested is not None:
            times.append(self.wake_requested + max(idle, sleep_policy.REQUEST_RESOLUTION_SECONDS))
        after = spec.scale_to_zero_after_seconds
        if after is not None:
            times.append(self.last_activity + after)
        if self.spec.prewake is not None:
            ahead = self.learnt.next_event(now, lead=self.spec.prewake.lead_seconds)
            if ahead is not None:
                times.append(ahead)
        future = [t for t in times if math.isfinite(t) and t + EPSILON > now]
        if future:
            at = max(min(future), now) + EPSILON
            if at not in self._timers:  # one wake-up per instant, however many cycles ask
                self._timers.add(at)
                self._push(at, "timer", -1)
