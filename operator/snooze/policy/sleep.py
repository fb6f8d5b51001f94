"""The sleep and wake decision for one model's engines: observations, a spec and a clock in,
actions out; and the phase those engines add up to."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from snooze.api.conditions import ConditionReason
from snooze.api.models import DesiredState, EngineState, InferenceModelSpec, Phase
from snooze.api.reasons import FailureReason

# Wake retries back off exponentially from this, up to the cap; failureThreshold bounds them.
RETRY_BASE_SECONDS = 1.0
RETRY_CAP_SECONDS = 60.0
# OUT_OF_MEMORY: a restart of this engine frees no one else's memory, so it is never this
# failure's remedy (a pool makes room; the wake is tried again). MEMORY_NOT_FREED: a GPU pool
# member whose sleep did not give its device memory back (policy/pool/trust.py).
NOT_RETRIED = (
    FailureReason.HYBRID_KV_CACHE_REINIT,
    FailureReason.OUTPUT_MISMATCH,
    FailureReason.WEIGHTS_MISMATCH,
)
"""Failed wakes no retry mends: the hybrid KV-cache crash leaves the engine unable to wake,
and an engine that woke answering differently is awake already. Only a restart recovers them."""
REQUEST_RESOLUTION_SECONDS = 1.0


@dataclass(frozen=True, kw_only=True)
class EngineView:
    """What the operator knows of one pod's engine at one instant."""

    pod: str
    ready: bool
    """The pod is Ready (its engine has loaded and answers) and not being deleted."""
    label: EngineState | None
    """The pod's `snooze.dev/state` label, the published routing view."""
    sleeping: bool | None
    """The engine's own answer to /is_sleeping; None when the probe failed."""
    busy: bool
    """Requests are running or waiting on the engine now."""
    last_activity: float
    """When the engine last had work (seconds since the epoch)."""
    action_running: bool = False
    """An action (drain, sleep, wake) is in flight on this engine."""
    sleep_started: float | None = None
    """When its last sleep began (the drain), from the pod's annotation."""
    woke_at: float | None = None
    """When its pod was last published awake (None: not known)."""
    sleep_sent: float | None = None
    """When /sleep was sent for the last drain, from the pod's annotation (if it was)."""
    sleep_running: bool | None = None
    """Whether the engine says a sleep is under way (vLLM 0.32+); None: it does not say."""
    wake_failures: int = 0
    """Failed wakes in a row."""
    last_failure: float | None = None
    """When the last wake failed."""
    last_failure_reason: str = ""
    pooled: bool = False
    """A member of a GPU pool: it wakes only when the pool grants it room."""
    pool_grant: bool = False
    """The pool has room for it now."""
    pool_evict: bool = False
    """The pool puts it to sleep to make room for another model's engine."""
    pool_headroom: bool = False
    """That sleep only keeps room ahead of wakes (or primes it): no wake is promised its memory."""
    pool_promised: bool = False
    """Its drain under way makes room the pool promised to a wake: a request does not cancel it."""
    pool_rewake: bool = False
    """The pool slept it only to pin its host copy (priming) and has room to wake it back now."""
    pool_level: int | None = None
    """The level the pool has it sleep at (2 when the pool's host memory is full)."""
    pool_restart: bool = False
    """The pool found that its sleep keeps its device memory, and the model's remedy for a
    failed engine is a restart: its pod is deleted (its controller recreates it)."""
    sleep_level: int | None = None
    """The level it sleeps at now, when known: its wake follows it, whatever the spec says now."""
    sleep_failures: int = 0
    """Failed sleeps in a row: the next try waits as a wake retry does."""
    last_sleep_failure: float | None = None
    sleep_blocked: bool = False
    """The engine cannot sleep at all for this pod and spec (no sleep mode, or a known vLLM
    bug leaves no safe level): never try."""
    fallback_level: int | None = None
    """The level a known vLLM bug moves its sleeps to (policy/knownbugs.py), if any."""
    drained_only: bool = False
    """A known vLLM bug kills it if /sleep meets requests in flight: give up a drain that
    times out rather than send it."""
    quarantined: bool = False
    """It woke answering (or weighing) differently than before its sleep: never routed to
    again, only restarted (wake.onFailure: Restart) or left failed (Report)."""


class ActionKind(StrEnum):
    SLEEP = "Sleep"
    """Label draining, wait for in-flight requests, sleep, label asleep."""
    WAKE = "Wake"
    """Label waking, run the level-aware wake, confirm, label awake."""
    CANCEL_SLEEP = "CancelSleep"
    """Tell the drain in progress on this engine to stop: a request wants the model awake.
    The only action given for an engine whose action is running, since it acts on that one."""
    RESTART = "Restart"
    """Delete the pod so its controller recreates it (wake.onFailure: Restart)."""
    LABEL = "Label"
    """Publish what the engine already is (after a restart of the operator, or a new pod)."""
    MARK_FAILED = "MarkFailed"
    """Give up on waking it (wake.onFailure: Report); a newer wake request tries again."""
    ASK_ROOM = "AskRoom"
    """A pool member that should wake: ask its pool for room (the pool grants it in turn)."""


class ActionReason(StrEnum):
    """Why the policy acts (an Event's message says it, operator/model/stepwords.py); a restart or
    a give-up names the failure (api/reasons.py) instead."""

    IDLE = "Idle"
    DESIRED_ASLEEP = "DesiredAsleep"
    DESIRED_AWAKE = "DesiredAwake"
    WAKE_REQUESTED = "WakeRequested"
    MIN_AWAKE = "MinAwake"
    PRIMED = "Primed"
    """Woken back after a sleep that only pinned its host copy (a GPU pool's prime)."""
    MAKE_ROOM = "MakeRoom"
    """Put to sleep so that its GPU pool has room for another member's wake."""
    SCALED_BY_HAND = "ScaledByHand"
    """Someone scaled the workload: noted, not acted on."""
    SCALE_TO_ZERO_DISABLED = "ScaleToZeroDisabled"


@dataclass(frozen=True, kw_only=True)
class Action:
    kind: ActionKind
    pod: str
    reason: str
    label: EngineState | None = None
    level: int | None = None
    """For SLEEP, the level to sleep at; for WAKE, the level the engine sleeps at."""
    drained_only: bool = False
    """For SLEEP: send /sleep only once nothing is in flight (a known vLLM bug)."""


@dataclass(frozen=True, kw_only=True)
class ModelView:
    """The model-level facts the decision needs besides its engines."""

    spec: InferenceModelSpec
    wake_requested: float | None
    """The time in the `snooze.dev/wake-requested-at` annotation."""
    now: float
    sleep_grace: float = 0.0
    """How long a sent /sleep may take: a `draining` label left by an operator that stopped
    after sending it is left alone this long, since the engine may still be freeing memory."""


def retry_delay(failures: int) -> float:
    """Seconds to wait before the next wake attempt after `failures` failed ones."""
    if failures <= 0:
        return 0.0
    return float(min(RETRY_CAP_SECONDS, RETRY_BASE_SECONDS * 2 ** (failures - 1)))


def may_try_sleep(engine: EngineView, now: float) -> bool:
    """Neither blocked nor backing off from a failed sleep. A failed sleep left the engine
    awake and routable; trying again every probe would drain it again and again."""
    if engine.sleep_blocked:
        return False
    if engine.last_sleep_failure is None:
        return True
    return now - engine.last_sleep_failure >= retry_delay(engine.sleep_failures)


def wants_wake(engine: EngineView, model: ModelView) -> bool:
    """A wake request arrived after this engine began to sleep (or we cannot tell when that was),
    and after it was last published awake: a wake since then answered it."""
    if not model.spec.wake.on_request or model.wake_requested is None:
        return False
    if engine.woke_at is not None and model.wake_requested <= engine.woke_at:
        return False
    return _after_sleep(engine, model.wake_requested)


def _after_sleep(engine: EngineView, requested: float) -> bool:
    if engine.sleep_started is None:
        return True
    # A request stamped by hand (`date -u +%FT%TZ`) has whole seconds: one made in the same
    # second as the sleep began counts as after it. At worst that wakes an engine once more.
    return requested >= engine.sleep_started - REQUEST_RESOLUTION_SECONDS


def answered_request(engines: Sequence[EngineView], model: ModelView) -> bool:
    """Whether the wake request is one that a wake has answered and that only an engine that
    went back to sleep without Snooze (or whose sleep began before it) would take for a new
    one: no engine wants it, and one would but for its wake since. Such a request is cleared,
    or it would stand for ever against an engine that says it sleeps again."""
    requested = model.wake_requested
    if not model.spec.wake.on_request or requested is None:
        return False
    if any(wants_wake(e, model) for e in engines):
        return False
    return any(
        e.woke_at is not None and requested <= e.woke_at and _after_sleep(e, requested)
        for e in engines
        if e.label is not EngineState.AWAKE
    )


def decide(engines: Sequence[EngineView], model: ModelView) -> list[Action]:
    """The actions to take now: at most one per engine, and none on an engine already acting,
    but for CANCEL_SLEEP, which speaks to the drain running there.

    A GPU pool's member wakes only with the pool's grant (it asks for room otherwise), is not
    kept from a sleep the pool ordered, and sleeps when the pool makes room with it.
    """
    return _with_levels(_through_pool(_decide(engines, model), engines, model), engines, model)


def next_idle_deadline(engines: Sequence[EngineView], model: ModelView) -> float | None:
    """The earliest instant after `model.now` at which an awake engine may sleep as idle by
    the passing of time alone: idle for `idle.after`, any wake request older than its quiet
    period, any failed sleep's backoff over, the grace of a drain left over with its sleep
    sent over. The loop cycles then rather than at its next regular cycle, which would add
    up to a whole interval to the sleep; None if there is none.
    """
    spec = model.spec
    if spec.desired_state is not DesiredState.AUTO:
        return None
    idle_after = spec.idle_after_seconds
    if not math.isfinite(idle_after):
        return None
    quiet_until = -math.inf
    if model.wake_requested is not None:
        # The quiet period includes its last instant (see _decide).
        quiet = max(idle_after, REQUEST_RESOLUTION_SECONDS)
        quiet_until = math.nextafter(model.wake_requested + quiet, math.inf)
    deadlines = []
    for e in engines:
        # Whatever its label says: one out of date is set right in the same cycle.
        if not e.ready or e.action_running or e.busy or e.sleeping is not False:
            continue
        if e.sleep_blocked or e.quarantined:
            continue
        deadline = max(e.last_activity + idle_after, quiet_until)
        standing = _drain_sent_at(e, model)
        if standing is not None:
            # A drain left over with its /sleep sent stands until its grace is over; only then
            # is the engine published awake again and slept as idle (_settled_label).
            deadline = max(deadline, standing + model.sleep_grace)
        if e.last_sleep_failure is not None:
            deadline = max(deadline, e.last_sleep_failure + retry_delay(e.sleep_failures))
        if deadline > model.now:
            deadlines.append(deadline)
    return min(deadlines, default=None)


def _with_levels(
    actions: list[Action], engines: Sequence[EngineView], model: ModelView
) -> list[Action]:
    """Sleep at the spec's level (or the pool's); wake from the level the engine sleeps at: a
    level-1 wake of an engine that slept at level 2 would serve garbage."""
    views = {e.pod: e for e in engines}
    spec_level = model.spec.sleep.level
    out = []
    for action in actions:
        engine = views[action.pod]
        if action.kind is ActionKind.SLEEP:
            level = engine.pool_level if engine.pooled and engine.pool_level else spec_level
            level = engine.fallback_level or level
            action = replace(action, level=level, drained_only=engine.drained_only)
        elif action.kind is ActionKind.WAKE:
            action = replace(action, level=engine.sleep_level or spec_level)
        out.append(action)
    return out


def _through_pool(
    actions: list[Action], engines: Sequence[EngineView], model: ModelView
) -> list[Action]:
    views = {e.pod: e for e in engines}
    out: list[Action] = []
    for action in actions:
        engine = views[action.pod]
        if not engine.pooled:
            out.append(action)
        elif action.kind is ActionKind.WAKE and not engine.pool_grant:
            out.append(replace(action, kind=ActionKind.ASK_ROOM))
        elif action.kind is ActionKind.CANCEL_SLEEP and (
            engine.pool_promised or (engine.pool_evict and not engine.pool_headroom)
        ):
            continue  # its room is promised to another model (a headroom sleep's is not)
        else:
            out.append(action)
    decided = {a.pod for a in out if a.kind is not ActionKind.LABEL}
    for engine in engines:
        # Its pool found its sleep keeps its memory: restarted, whatever else was decided.
        if engine.pool_restart and engine.ready and not engine.action_running:
            out = [a for a in out if a.pod != engine.pod]
            out.append(
                Action(
                    kind=ActionKind.RESTART, pod=engine.pod, reason=FailureReason.MEMORY_NOT_FREED
                )
            )
            decided.add(engine.pod)
    if model.spec.desired_state is DesiredState.AWAKE:
        return out
    for engine in engines:
        if (
            engine.pooled
            and engine.pool_evict
            and engine.pod not in decided
            and engine.ready
            and not engine.sleep_blocked
            and not engine.action_running
            and engine.sleeping is False
            and engine.label is EngineState.AWAKE
        ):
            out.append(Action(kind=ActionKind.SLEEP, pod=engine.pod, reason=ActionReason.MAKE_ROOM))
    return out


def _decide(engines: Sequence[EngineView], model: ModelView) -> list[Action]:
    spec = model.spec
    actions = _quarantine(engines, model)
    engines = [e for e in engines if not e.quarantined]
    candidates = [e for e in engines if e.ready and not e.action_running and e.sleeping is not None]

    # 1. Publish the truth: a label that disagrees with the engine and has no action behind it
    #    is a leftover (operator restarted mid-step, or a new pod with no label yet). A drain
    #    cut off before its /sleep was sent is resumed, not left to time out.
    settled: list[EngineView] = []
    awake_now = sum(1 for e in candidates if e.label is EngineState.AWAKE and not e.sleeping)
    for engine in candidates:
        if _resumes_drain(engine, model, awake_others=awake_now):
            actions.append(Action(kind=ActionKind.SLEEP, pod=engine.pod, reason="ResumeDrain"))
            continue
        label = _settled_label(engine, model)
        if label is not None:
            actions.append(
                Action(kind=ActionKind.LABEL, pod=engine.pod, reason="Observed", label=label)
            )
        settled.append(replace(engine, label=label) if label is not None else engine)

    awake = [e for e in settled if e.label is EngineState.AWAKE]
    # A drain is the one action that another may interrupt: the running drain is told to stop.
    draining = [
        e for e in engines if e.ready and e.action_running and e.label is EngineState.DRAINING
    ]
    asleep = [e for e in settled if e.label in (EngineState.ASLEEP, EngineState.FAILED)]
    in_flight_awake = sum(
        1
        for e in engines
        if e.action_running and e.label in (EngineState.WAKING, EngineState.AWAKE)
    )
    decided = {a.pod for a in actions if a.kind is not ActionKind.LABEL}

    def act(kind: ActionKind, engine: EngineView, reason: str) -> None:
        actions.append(Action(kind=kind, pod=engine.pod, reason=reason))
        decided.add(engine.pod)

    # 2. Wake what must be awake.
    desired = spec.desired_state
    for engine in draining:
        if desired is not DesiredState.ASLEEP and (
            desired is DesiredState.AWAKE or wants_wake(engine, model)
        ):
            why = (
                ActionReason.DESIRED_AWAKE
                if desired is DesiredState.AWAKE
                else ActionReason.WAKE_REQUESTED
            )
            act(ActionKind.CANCEL_SLEEP, engine, why)
    for engine in asleep:
        reason = _wake_reason(engine, model)
        if reason is None:
            continue
        gate = _failure_gate(engine, model)
        if gate is not None:
            if gate is not ActionKind.WAKE:
                act(gate, engine, engine.last_failure_reason or ConditionReason.WAKE_FAILED)
            continue
        act(ActionKind.WAKE, engine, reason)
    woken = sum(1 for a in actions if a.kind in (ActionKind.WAKE, ActionKind.CANCEL_SLEEP))
    if desired is DesiredState.AUTO:
        missing = spec.min_awake - (len(awake) + in_flight_awake + woken)
        for engine in sorted(asleep, key=lambda e: e.wake_failures):
            if missing <= 0:
                break
            if engine.pod in decided:
                continue
            gate = _failure_gate(engine, model)
            if gate is ActionKind.WAKE:
                continue
            if gate is not None:
                act(gate, engine, engine.last_failure_reason or ConditionReason.WAKE_FAILED)
                continue
            act(ActionKind.WAKE, engine, ActionReason.MIN_AWAKE)
            missing -= 1

    # 3. Sleep what may sleep: never a busy engine in Auto, never below minAwake.
    if desired is DesiredState.ASLEEP:
        for engine in awake:
            if may_try_sleep(engine, model.now):
                act(ActionKind.SLEEP, engine, ActionReason.DESIRED_ASLEEP)
    elif desired is DesiredState.AUTO:
        idle_after = spec.idle_after_seconds
        quiet = max(idle_after, REQUEST_RESOLUTION_SECONDS)
        if model.wake_requested is not None and model.now - model.wake_requested <= quiet:
            # A wake was asked for within the idle period: the model is wanted, whatever an
            # engine's own counters say yet. (Never less than the requests' resolution, or a
            # sleep begun within it would count as before the request and be woken again.)
            return actions
        idle = [
            e
            for e in awake
            if not e.busy
            and model.now - e.last_activity >= idle_after
            and may_try_sleep(e, model.now)
        ]
        # Longest idle first, so that the engines kept for minAwake are the most recently used.
        idle.sort(key=lambda e: e.last_activity)
        # Only a wake in flight holds the floor: an engine acting under an awake label may be
        # starting its drain (the draining label is its first step).
        waking = sum(1 for e in engines if e.action_running and e.label is EngineState.WAKING)
        may_sleep = len(awake) - max(spec.min_awake - waking, 0)
        for engine in idle[: max(may_sleep, 0)]:
            act(ActionKind.SLEEP, engine, ActionReason.IDLE)
    return actions


def _quarantine(engines: Sequence[EngineView], model: ModelView) -> list[Action]:
    """An engine that woke answering differently gets nothing but its remedy: restarted
    (wake.onFailure: Restart), or kept `failed` (Report) until its process is replaced."""
    actions = []
    for engine in engines:
        if not engine.quarantined or not engine.ready or engine.action_running:
            continue
        reason = engine.last_failure_reason or FailureReason.OUTPUT_MISMATCH
        if model.spec.wake.on_failure == "Restart":
            actions.append(Action(kind=ActionKind.RESTART, pod=engine.pod, reason=reason))
        elif engine.label is not EngineState.FAILED:
            actions.append(
                Action(
                    kind=ActionKind.LABEL, pod=engine.pod, reason=reason, label=EngineState.FAILED
                )
            )
    return actions


def _wake_reason(engine: EngineView, model: ModelView) -> str | None:
    desired = model.spec.desired_state
    if desired is DesiredState.ASLEEP:
        return None
    if desired is DesiredState.AWAKE:
        return ActionReason.DESIRED_AWAKE
    if wants_wake(engine, model):
        return ActionReason.WAKE_REQUESTED
    if engine.pool_rewake and engine.pool_grant:
        return ActionReason.PRIMED
    return None


def _failure_gate(engine: EngineView, model: ModelView) -> ActionKind | None:
    """None when a wake may go ahead; WAKE when it must wait (backoff); else the remedy."""
    if engine.wake_failures == 0:
        return None
    wake = model.spec.wake
    hybrid = engine.last_failure_reason in NOT_RETRIED
    # The hybrid KV-cache crash leaves the engine unable to wake until it restarts: retrying
    # it only holds requests longer.
    if hybrid or engine.wake_failures >= wake.failure_threshold:
        if (
            wake.on_failure == "Restart"
            and engine.last_failure_reason != FailureReason.OUT_OF_MEMORY
        ):
            return ActionKind.RESTART
        if engine.label is EngineState.FAILED:
            # Reported already: only a wake request newer than the failure tries again.
            retry = (
                model.wake_requested is not None
                and engine.last_failure is not None
                and model.wake_requested > engine.last_failure
                and not hybrid
            )
            return None if retry else ActionKind.WAKE
        return ActionKind.MARK_FAILED
    if engine.last_failure is not None and (
        model.now - engine.last_failure < retry_delay(engine.wake_failures)
    ):
        return ActionKind.WAKE
    return None


def _sent_for_this_drain(engine: EngineView) -> bool:
    return (
        engine.sleep_sent is not None
        and engine.sleep_started is not None
        and engine.sleep_sent >= engine.sleep_started
    )


def _wanted(engine: EngineView, model: ModelView) -> bool:
    return model.spec.desired_state is DesiredState.AWAKE or wants_wake(engine, model)


def _resumes_drain(engine: EngineView, model: ModelView, *, awake_others: int) -> bool:
    """A drain cut off (the operator stopped) before its /sleep was sent is carried on, as
    long as the model still wants it asleep: nothing was sent, so nothing can be repeated.
    So is one whose /sleep was marked sent but which the engine, awake, says it is not
    carrying out (vLLM 0.32+): the request never arrived, and sending it now sleeps it once."""
    if engine.sleeping or engine.label is not EngineState.DRAINING:
        return False
    if not may_try_sleep(engine, model.now):
        return False  # it cannot sleep, or backs off from a failed sleep: not again now
    lost = _sent_for_this_drain(engine) and engine.sleep_running is False
    if (_sent_for_this_drain(engine) and not lost) or _wanted(engine, model):
        return False
    desired = model.spec.desired_state
    return desired is DesiredState.ASLEEP or awake_others >= model.spec.min_awake


def _settled_label(engine: EngineView, model: ModelView) -> EngineState | None:
    """The label to publish when the current one is stale; None when it stands.

    With no action in flight, `waking` and `draining` are leftovers of an interrupted step
    (the operator restarted): the engine's own answer says where it really is. A cut-off wake
    leaves it asleep, and the wake request that started it is still newer than its sleep, so
    it is woken again. A drain whose /sleep was sent is left alone while that sleep can still
    be running, unless the model is wanted; then it is published awake again.
    """
    if engine.sleeping:
        keep = (EngineState.ASLEEP, EngineState.FAILED)
        return None if engine.label in keep else EngineState.ASLEEP
    sent = _drain_sent_at(engine, model)
    if sent is not None and model.now - sent < model.sleep_grace:
        return None
    return None if engine.label is EngineState.AWAKE else EngineState.AWAKE


def _drain_sent_at(engine: EngineView, model: ModelView) -> float | None:
    """When the /sleep of a `draining` engine not known asleep was sent, if that sleep may
    still be running and the model does not want the engine (the drain then stands for
    `sleep_grace` from that instant); None otherwise."""
    if (
        engine.label is EngineState.DRAINING
        and _sent_for_this_drain(engine)
        and engine.sleep_running is not False
        and not _wanted(engine, model)
    ):
        return engine.sleep_sent
    return None


def phase(labels: Sequence[EngineState | None], *, ready: int, spec_valid: bool) -> Phase:
    """The model's phase from its engines' published states."""
    if not spec_valid:
        return Phase.INVALID
    if ready == 0 or not labels:
        return Phase.PENDING
    count = {state: sum(1 for label in labels if label is state) for state in EngineState}
    if count[EngineState.FAILED]:
        return Phase.DEGRADED
    if count[EngineState.WAKING]:
        return Phase.WAKING
    if count[EngineState.AWAKE]:
        return Phase.AWAKE
    if count[EngineState.DRAINING]:
        return Phase.DRAINING
    if count[EngineState.ASLEEP]:
        return Phase.ASLEEP
    return Phase.PENDING
