"""What a model's loop learns of its engines: one probe each, and what each answer is noted as."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass

from snooze.api.eventreasons import EventReason
from snooze.api.models import InferenceModelSpec
from snooze.engine.client import SleepState
from snooze.engine.errors import EngineError
from snooze.engine.probe import Prober
from snooze.kube.pods import PodInfo
from snooze.operator.events.emit import Emit
from snooze.operator.memory import UNREACHABLE_AFTER, EngineMemory, ModelMemory, process_of
from snooze.policy import probing
from snooze.policy.brakes import Claim, Pace, hear, telling

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Probe:
    pod: str
    sleeping: bool | None
    in_flight: int = 0
    success_total: float | None = None
    sleep_level: int | None = None
    gpu_share: float | None = None
    sleeps_in_flight: int | None = None
    source: str = ""
    """Where `sleeping` was read: the metrics' sleep-state gauge, or /is_sleeping."""
    error: str = ""
    """Why the probe got no usable answer (names the URL), when it got none."""
    reason: str = ""
    """Its EngineError's reason then (Unreachable, Timeout, AnswerTooLarge, InvalidAnswer...)."""


async def probe(
    prober: Prober,
    url: str,
    pod: str,
    *,
    share_known: bool,
    urgent: bool = False,
    owner: Hashable = None,
    confirm_awake: bool = False,
) -> Probe:
    """A filtered `/metrics` scrape; `/is_sleeping` too when the engine does not publish
    `vllm:engine_sleep_state` (before vLLM 0.11.1), or when it says awake and `confirm_awake`
    (an engine partly woken reads awake there before 0.31). One request per probe rather than
    two: at a thousand models, HTTP requests are most of the operator's CPU. `urgent` probes
    take their turn before routine ones; the probes of different `owner`s (models) take turns."""
    try:
        activity = await prober.activity(url, share_known=share_known, urgent=urgent, owner=owner)
        state = activity.sleep_state
        if state is None:
            sleeping = await prober.is_sleeping(url, urgent=urgent, owner=owner)
            source = "/is_sleeping"
        else:
            sleeping = state is not SleepState.AWAKE
            source = "/metrics (vllm:engine_sleep_state)"
            if not sleeping and confirm_awake:
                with contextlib.suppress(EngineError):  # none to ask: the gauge stands
                    sleeping = await prober.is_sleeping(url, urgent=urgent, owner=owner)
                    source = "/is_sleeping (the gauge's awake doubted on this release)"
    except EngineError as exc:
        # Logged once it counts (note_reachability's Event), not at every probe.
        log.debug("probe of %s failed: %s", pod, exc)
        return Probe(pod=pod, sleeping=None, error=str(exc), reason=exc.reason)
    return Probe(
        pod=pod,
        sleeping=sleeping,
        in_flight=activity.in_flight,
        success_total=activity.success_total,
        sleep_level=activity.sleep_level,
        gpu_share=activity.gpu_memory_utilization,
        sleeps_in_flight=activity.sleeps_in_flight,
        source=source,
    )


def first_try(engine: EngineMemory) -> bool:
    """Whether this is the first probe of an engine that has never answered one."""
    return engine.last_probe is None and not engine.answered


def note_answer(
    memory: ModelMemory,
    engine: EngineMemory,
    pod: PodInfo,
    spec: InferenceModelSpec,
    result: Probe | None,
    *,
    traffic: probing.Traffic | None,
    probed_at: float,
    now: float,
    pace: Pace,
) -> str | None:
    """Note on the engine's memory what its probe this cycle said (None: not probed) and the
    activity the gateway's counters add; what to tell, once, if the engine contradicts itself
    (its claim of sleep is then believed at the brake's pace: policy/brakes.py)."""
    if result is not None and result.sleeping is not None and not engine.answered:
        # Its idle clock starts when its engine first answers, not when its pod was first
        # seen: a model that loads longer than idle.after is not slept the moment it is ready.
        engine.answered = True
        engine.last_activity = max(engine.last_activity, now)
        if not memory.answered:
            # So does the model's, which scaleToZeroAfter reads; a pod restarted later does
            # not count again (new pods are not activity).
            memory.answered = True
            memory.last_activity = max(memory.last_activity or 0.0, now)
    answered = result is not None and result.sleeping is not None
    activity = probing.seen(
        now=now,
        last_activity=engine.last_activity,
        probe=probing.Probed(in_flight=result.in_flight, total=result.success_total, at=probed_at)
        if answered and result is not None
        else None,
        previous_total=engine.success_total,
        traffic=traffic,
        ledger=engine.ledger,
        direct_before=engine.direct_activity,
    )
    engine.busy, engine.direct_activity = activity.busy, activity.direct_activity
    engine.ledger = activity.ledger
    if activity.last_activity > engine.last_activity:
        engine.last_activity = activity.last_activity
        memory.last_activity = max(memory.last_activity or 0, activity.last_activity)
    if answered and result is not None:
        if result.success_total is not None:
            engine.note_served(result.success_total, now)
        engine.success_total = result.success_total
        engine.gpu_share = result.gpu_share or engine.gpu_share
        engine.sleeps_in_flight = result.sleeps_in_flight
        if result.sleep_level is not None:
            engine.sleep_level = result.sleep_level
    told = None
    if result is not None:
        engine.sleeping = result.sleeping
        engine.last_probe = now
        process = process_of(pod, spec.engine.port)
        if result.sleeping is not None:
            claim = Claim(sleeping=result.sleeping, at=now, source=result.source)
            heard = hear(engine.brake, claim, process=process, prompted=engine.prompted, pace=pace)
            engine.brake, engine.sleeping, engine.prompted = heard.brake, heard.sleeping, False
            if heard.contradiction is not None:
                told = telling(heard.contradiction, pace=pace, brake=heard.brake, now=now)
        level = engine.sleep_level or pod.sleep_level or spec.sleep.level
        if engine.sleeping and level == 1:
            engine.note_host_copy(process)
    return told


def note_reachability(pod: str, engine: EngineMemory, result: Probe, emit: Emit) -> None:
    """Count probes in a row without an answer; tell when an engine becomes unreachable
    (naming the URL tried) and when it answers again."""
    was = engine.unreachable
    unanswered_since = engine.unanswered_since
    if result.sleeping is None:
        if engine.probe_failures == 0:
            engine.unanswered_since = time.time()
        engine.probe_failures += 1
        engine.probe_error = result.error
    else:
        engine.probe_failures, engine.probe_error = 0, ""
        engine.unanswered_since = None
    if engine.unreachable and not was:
        emit(
            "Warning",
            EventReason.ENGINE_UNREACHABLE,
            f"{pod}: no usable answer to {UNREACHABLE_AFTER} probes in a row ({result.reason}), "
            f"so it gets no requests, and is neither slept nor woken, until it answers: "
            f"{engine.probe_error}",
        )
    elif was and not engine.unreachable:
        # It got no requests while unreachable (the gateway routes none to it): its idle
        # clock stood still meanwhile, or it would be put to sleep the moment it is back.
        # Paused, not restarted: probes that time out because the operator itself is
        # overloaded (thousands of engines falling idle at once) would otherwise give
        # every engine they touch a whole new idle.after.
        now = time.time()
        unreachable_for = now - (unanswered_since or now)
        engine.last_activity = min(now, engine.last_activity + unreachable_for)
        emit("Normal", EventReason.ENGINE_REACHABLE, f"{pod}: the engine answers again")
