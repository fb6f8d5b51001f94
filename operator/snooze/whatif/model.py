"""One model in a whatif simulation: its engines, the gateway's holds, and the operator's real
decisions (sleep_policy.decide, scale_policy.decide_scale, the schedule and pre-wake policies)
taken whenever something may have changed; the clock that drives it is its group's."""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Protocol

from snooze.api.models import EngineState, InferenceModelSpec
from snooze.policy import prewake as prewake_policy
from snooze.policy import scale as scale_policy
from snooze.policy import schedule as schedule_policy
from snooze.policy import sleep as sleep_policy
from snooze.policy.sleep import ActionKind, ActionReason
from snooze.whatif.engines import Engine, Outcome
from snooze.whatif.latency import Latencies
from snooze.whatif.trace import ModelRequests

EPSILON = 1e-6
"""Timers fire this long after their deadline, so that `now - since >= after` holds despite
floating-point rounding."""


class TargetMissed(Exception):
    """A model's added latency is over the bound it was given at that quantile, whatever
    comes next: `at_least` is what that quantile is at least."""

    def __init__(self, model: str, at_least: float) -> None:
        super().__init__(f"{model}: held over the bound, at least {at_least:.2f}s")
        self.model = model
        self.at_least = at_least


class Clock(Protocol):
    def push(self, at: float, kind: str, model: int, engine: int) -> None: ...


class Pool(Protocol):
    """What a model's engines see of the GPU pool they belong to (whatif.pooling)."""

    def view(self, engine: Engine, view: sleep_policy.EngineView) -> sleep_policy.EngineView: ...

    def ask(self, model: ModelSim, pods: list[str], now: float) -> None: ...

    def made_room(self, model: ModelSim, engine: Engine, now: float) -> None: ...


class ModelSim:
    """One model, one policy: `arrive` for each of its requests, `event` for its engines'
    events, `cycle` for the operator's decision, all at the group clock's times."""

    def __init__(
        self,
        *,
        index: int,
        spec: InferenceModelSpec,
        requests: ModelRequests,
        latencies: Latencies,
        clock: Clock,
        engines: int = 1,
        measure_from: float,
        start: float,
        end: float,
        recent: bool = False,
    ) -> None:
        self.index = index
        self.name = requests.name
        self.spec = spec
        self.requests = requests
        self.lat = latencies
        self.clock = clock
        self.start = start
        self.end = max(end, self._last_answer())
        self.span_end = self.end
        """Always-on is counted to here: the last answer had no request been held."""
        self.measure_from = measure_from
        # Engines begin awake and freshly used: the trace starts where traffic was.
        self.engines = [
            Engine(
                pod=f"{index}:{i}",
                index=i,
                last_activity=start,
                awake_since=start,
                resident_since=start,
                finished=deque() if recent else None,
            )
            for i in range(engines)
        ]
        self.pool: Pool | None = None
        self.wake_requested: float | None = None
        self.last_activity = start
        self.replicas = engines
        self.scaled_from: int | None = None
        self.scaled_at: float | None = None
        self.held: list[int] = []
        """Indices of the requests held for a wake."""
        self.learns = spec.prewake is not None or spec.idle.after == "Auto"
        self.learnt = prewake_policy.Learnt(
            profile=prewake_policy.Profile(
                zone=spec.prewake.time_zone if spec.prewake is not None else "UTC"
            )
        )
        self.lead = spec.prewake.lead_seconds if spec.prewake is not None else 0.0
        self.out = Outcome()
        self.device_changes: list[tuple[float, int]] = []
        """When the count of its engines' pods changed, and by how much."""
        self._spec_now = spec
        self._auto: tuple[prewake_policy.GapHistogram, InferenceModelSpec] | None = None
        self._idle: dict[str, float] = {}
        self._bound: tuple[float, int] | None = None
        self._over: list[float] = []
        """The longest held latencies over the bound (see give_up_over)."""

    def _last_answer(self) -> float:
        tokens = self.requests.tokens
        seconds = self.lat.token_seconds
        default = self.lat.output_tokens
        return max(
            at + seconds * (default if tokens[i] < 0 else tokens[i])
            for i, at in enumerate(self.requests.at)
        )

    def edges(self) -> list[float]:
        """The instants a keep-awake window starts or ends, where a decision may change."""
        windows = schedule_policy.edges(self.spec.schedule, self.start - 1, self.end)
        return [e.at for e in windows]

    def _measured(self, at: float) -> bool:
        return at >= self.measure_from

    def _service(self, i: int) -> float:
        tokens = self.requests.tokens[i]
        return self.lat.token_seconds * (self.lat.output_tokens if tokens < 0 else tokens)

    # --- the gateway ---------------------------------------------------------------------

    def steady(self) -> bool:
        """Nothing can change without time passing: every pod awake, idle or busy, nothing
        held, starting or acting. A request then is only served (no decision to take)."""
        if self.held or self.replicas == 0:
            return False
        for e in self.engines:
            if e.present and (
                e.action is not None or e.ready_at is not None or e.label is not EngineState.AWAKE
            ):
                return False
        return True

    def retire(self, now: float, *, inclusive: bool) -> None:
        for engine in self.engines:
            last = engine.retire(now, inclusive=inclusive)
            if last is not None and last > self.last_activity:
                self.last_activity = last

    def arrive(self, i: int, now: float) -> bool:
        """Request `i` arrives; whether a decision must follow (False: it was only served)."""
        self.retire(now, inclusive=False)
        if self._measured(now):
            self.out.requests += 1
        steady = self.steady()
        awake = [e for e in self.engines if e.present and e.label is EngineState.AWAKE]
        steady_learning = True
        if self.learns:
            busy = any(e.ends for e in self.engines)
            before = self.learnt
            self.learnt = self.learnt.request(
                now, idle_since=None if busy else self.last_activity, found_asleep=not awake
            )
            self._note(before, now)
            steady_learning = self.learnt is before
            steady = steady and steady_learning
        if awake:
            engine = min(awake, key=lambda e: e.running)
            engine.serve(now, self._service(i))
            self.last_activity = now
            return not steady
        waiting = bool(self.held)
        self.held.append(i)
        starting = any(
            e.action is ActionKind.WAKE or (e.present and e.ready_at is not None)
            for e in self.engines
        )
        if not starting:
            self.wake_requested = now  # the gateway's annotation: once per wake
        # A request held behind others changes no decision: their arrival asked for the wake
        # already (a later look reads the newer wake request all the same).
        return not waiting or not steady_learning

    def _release(self, engine: Engine, now: float) -> None:
        held, self.held = self.held, []
        for i in held:
            at = self.requests.at[i]
            if self._measured(at):
                self._held(now - at)
            engine.serve(now, self._service(i))

    def give_up_over(self, bound: float, quantile: float) -> None:
        """Stop the simulation (TargetMissed) once so many of this model's measured requests
        were held longer than `bound` that its `quantile` must be over it."""
        count = sum(1 for at in self.requests.at if self._measured(at))
        rank = max(1, min(count, round(quantile * count + 0.5)))
        self._bound = (bound, count - rank + 1)

    def _held(self, added: float) -> None:
        self.out.held.append(added)
        if self._bound is not None and added > self._bound[0]:
            allowed = self._bound[1]
            heapq.heappush(self._over, added)
            if len(self._over) > allowed:
                heapq.heappop(self._over)
            if len(self._over) >= allowed:
                raise TargetMissed(self.name, self._over[0])

    # --- the engines ---------------------------------------------------------------------

    def event(self, kind: str, engine: Engine, now: float) -> None:
        self.retire(now, inclusive=True)
        if kind == "action":
            self._finish(engine, now)
        elif kind == "ready":
            self._ready(engine, now)

    def _finish(self, engine: Engine, now: float) -> None:
        action, engine.action = engine.action, None
        if action is ActionKind.SLEEP:
            engine.label, engine.sleeping = EngineState.ASLEEP, True
            self._close(engine, now)
        elif action is ActionKind.WAKE:
            engine.label, engine.sleeping, engine.sleep_level = EngineState.AWAKE, False, 0
            engine.resident_since = now
            # As the operator does: a woken engine starts a fresh idle period.
            engine.last_activity = self.last_activity = now
            self._release(engine, now)

    def _ready(self, engine: Engine, now: float) -> None:
        if not engine.present or engine.ready_at is None:
            return
        engine.ready_at = None
        engine.label, engine.sleeping = EngineState.AWAKE, False
        engine.last_activity = self.last_activity = engine.resident_since = now
        self._release(engine, now)

    def _open(self, engine: Engine, now: float) -> None:
        if engine.awake_since is None:
            engine.awake_since = now

    def _close(self, engine: Engine, now: float) -> None:
        if engine.awake_since is not None:
            began = max(engine.awake_since, self.measure_from)
            self.out.engine_seconds_awake += max(0.0, min(now, self.end) - began)
            engine.awake_since = None

    def _start(self, action: sleep_policy.Action, now: float) -> bool:
        engine = self.engines[int(action.pod.rpartition(":")[2])]
        if action.kind is ActionKind.LABEL and action.label is not None:
            engine.label = action.label
        elif action.kind is ActionKind.SLEEP:
            # Idle: nothing to drain, so /sleep goes out at once and a wake cannot cancel it.
            engine.action, engine.label = ActionKind.SLEEP, EngineState.DRAINING
            engine.sleep_started, engine.sleep_level = now, action.level or 1
            seconds = self.lat.sleep(engine.sleep_level, pinned=engine.pinned)
            self.clock.push(now + seconds, "action", self.index, engine.index)
            engine.pinned = engine.pinned or engine.sleep_level == 1
            if action.reason == ActionReason.MAKE_ROOM and self.pool is not None:
                self.pool.made_room(self, engine, now)
            return True
        elif action.kind is ActionKind.WAKE:
            engine.action, engine.label = ActionKind.WAKE, EngineState.WAKING
            self._open(engine, now)
            if self._measured(now):
                self.out.wakes += 1
            self.clock.push(now + self.lat.wake(engine.sleep_level or 1), "action", self.index,
                            engine.index)  # fmt: skip
            return True
        return False

    # --- the operator --------------------------------------------------------------------

    def _effective(self, now: float) -> InferenceModelSpec:
        gaps = self.learnt.gaps
        if self._auto is None or self._auto[0] is not gaps:
            # The keep-alive changes only when a gap is learnt: choose it once per change.
            self._auto = (gaps, prewake_policy.effective_spec(self.spec, gaps))
        return schedule_policy.with_schedule(self._auto[1], now)

    def cycle(self, now: float) -> bool:
        """The operator's look at the model at `now`; whether it started anything."""
        self.retire(now, inclusive=True)
        spec = self._spec_now = self._effective(now)
        if self.spec.prewake is not None:
            asleep = not any(
                e.present and (e.label is not EngineState.ASLEEP or e.ready_at is not None)
                for e in self.engines
            )
            before = self.learnt
            self.learnt, fire = self.learnt.tick(now, lead=self.lead, asleep=asleep)
            self._note(before, now)
            if fire:
                self.wake_requested = now
        views = [self._view(e) for e in self.engines if e.present and e.ready_at is None]
        model = sleep_policy.ModelView(spec=spec, wake_requested=self.wake_requested, now=now)
        acted = False
        asks = []
        for action in sleep_policy.decide(views, model):
            if action.kind is ActionKind.ASK_ROOM:
                asks.append(action.pod)
            else:
                acted = self._start(action, now) or acted
        if self.pool is not None:
            self.pool.ask(self, asks, now)
        return self._scale(spec, now) or acted

    def _note(self, before: prewake_policy.Learnt, now: float) -> None:
        learnt = self.learnt
        if learnt is not before and self._measured(now):
            self.out.prewakes += learnt.prewakes - before.prewakes
            self.out.prewake_hits += learnt.hits - before.hits
            self.out.prewake_misses += learnt.misses - before.misses

    def _view(self, engine: Engine) -> sleep_policy.EngineView:
        view = sleep_policy.EngineView(
            pod=engine.pod,
            ready=True,
            label=engine.label,
            sleeping=engine.sleeping,
            busy=bool(engine.ends),
            last_activity=engine.last_activity,
            action_running=engine.action is not None,
            sleep_started=engine.sleep_started,
            sleep_level=engine.sleep_level if engine.sleeping else None,
        )
        return view if self.pool is None else self.pool.view(engine, view)

    def _scale(self, spec: InferenceModelSpec, now: float) -> bool:
        if spec.scale_target_ref is None:
            return False
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
            return False
        if decision.kind is scale_policy.ScaleKind.TO_ZERO:
            self.scaled_from, self.scaled_at, self.replicas = decision.replicas, now, 0
            self._devices(now, -sum(1 for e in self.engines if e.present))
            for engine in self.engines:
                engine.present = False
            return True
        if decision.kind is scale_policy.ScaleKind.UP:
            self.scaled_from, self.scaled_at, self.replicas = None, None, decision.replicas
            if self._measured(now):
                self.out.cold_starts += 1
            self._devices(now, len(self.engines[: decision.replicas]))
            for engine in self.engines[: decision.replicas]:
                engine.present, engine.ready_at = True, now + self.lat.cold_start_seconds
                engine.label, engine.sleeping = EngineState.WAKING, False
                engine.sleep_started, engine.sleep_level, engine.pinned = None, None, False
                self._open(engine, now)
                self.clock.push(engine.ready_at, "ready", self.index, engine.index)
            return True
        return False

    def _devices(self, now: float, change: int) -> None:
        """Pods (each with a device of its own, unless in a pool) gone or back at `now`."""
        if change:
            self.device_changes.append((now, change))

    # --- when to look again --------------------------------------------------------------

    def _idle_after(self, spec: InferenceModelSpec) -> float:
        text = spec.idle.after
        seconds = self._idle.get(text)
        if seconds is None:
            seconds = self._idle[text] = spec.idle_after_seconds
        return seconds

    def next_look(self, now: float) -> float | None:
        """The next instant a decision may change without an event: an idle period or a
        wake request's quiet time running out, a tier's delay, a pre-wake. An engine still
        busy is counted from its last request's end: the earliest it can have been idle long
        enough (a later request only puts that off, and a look too early does nothing)."""
        spec = self._spec_now
        times: list[float] = []
        idle = self._idle_after(spec)
        for engine in self.engines:
            if engine.present and engine.label is EngineState.AWAKE and engine.action is None:
                last = max(engine.ends) if engine.ends else engine.last_activity
                times.append(last + idle)
        if self.wake_requested is not None:
            times.append(self.wake_requested + max(idle, sleep_policy.REQUEST_RESOLUTION_SECONDS))
        after = spec.scale_to_zero_after_seconds
        if after is not None:
            ends = [max(e.ends) for e in self.engines if e.ends]
            times.append(max([self.last_activity, *ends]) + after)
        if self.spec.prewake is not None:
            ahead = self.learnt.next_event(now, lead=self.lead)
            if ahead is not None:
                times.append(ahead)
        future = [t for t in times if math.isfinite(t) and t + EPSILON > now]
        return max(min(future), now) + EPSILON if future else None

    # --- the end -------------------------------------------------------------------------

    def owes(self) -> bool:
        """Answers still owed: held requests, requests in flight, actions or starts."""
        return bool(self.held) or any(
            e.ends or e.action is not None or e.ready_at is not None for e in self.engines
        )

    def close(self, end: float) -> Outcome:
        """Count the span up to `end` (the group's last answer) and return the outcome. A
        request still held then was never answered (its model never got room to wake): it is
        counted held until the end, and unanswered."""
        self.end = max(self.end, end)
        for i in self.held:
            at = self.requests.at[i]
            if self._measured(at):
                self.out.unanswered += 1
                self._held(self.end - at)
        self.held = []
        for engine in self.engines:
            self._close(engine, self.end)
        span = self.span_end - max(self.start, self.measure_from)
        self.out.engine_seconds_always_on = len(self.engines) * max(span, 0.0)
        return self.out
