"""One model's keep-awake windows and pre-wake, for its loop: the spec and wake request the
decisions read (a window's minAwake, Auto's keep-alive, a pre-wake), what the traffic taught
(kept on the status so that a restart keeps it), the Events at window edges, the metrics."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from snooze.api.eventreasons import EventReason
from snooze.api.keepawake import PrewakeStatus, WindowStatus
from snooze.api.models import AUTO, InferenceModelSpec
from snooze.api.modelstatus import InferenceModelStatus
from snooze.api.times import format_time, moment, seconds_of
from snooze.operator.events.emit import Emit
from snooze.operator.memory import ModelMemory
from snooze.operator.metrics import OperatorMetrics
from snooze.policy import prewake as prewake_policy
from snooze.policy import schedule as schedule_policy
from snooze.policy.prewake import GapHistogram, Learnt, Prewake, Profile, ProfileError

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ToldWindow:
    """A keep-awake window as an Event last told it began."""

    name: str
    end: float | None
    """Its end, in seconds since the epoch (None: it has none)."""

    def same(self, other: ToldWindow) -> bool:
        """The same window, ending at the same time: the status keeps milliseconds, so a
        restored end may differ by less than that."""
        return (
            self.name == other.name
            and self.end is not None
            and other.end is not None
            and abs(self.end - other.end) < 0.01
        )


class Foresight:
    """What one model's loop adds to its decisions from its schedule and its own traffic."""

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        status: InferenceModelStatus,
        emit: Emit,
        metrics: OperatorMetrics,
        probe_interval: float = 10.0,
    ) -> None:
        self.namespace, self.name = namespace, name
        self.gap_floor = max(prewake_policy.GAP_RESOLUTION_SECONDS, 1.5 * probe_interval)
        self.emit, self.metrics = emit, metrics
        self._stored = status.prewake or PrewakeStatus()
        self.learnt: Learnt | None = None
        """Read from the status once the spec (the profile's time zone) is known."""
        active = status.active_window
        self.window: ToldWindow | None = (
            ToldWindow(name=active.name, end=seconds_of(active.end)) if active is not None else None
        )
        """The window in force as last told by an Event (restored, so a restart tells no edge
        twice)."""
        self.requests_seen: float | None = None
        self.activity_seen: float | None = None
        self.wake_seen: float | None = None

    def _restore(self, spec: InferenceModelSpec, now: float) -> Learnt:
        zone = spec.prewake.time_zone if spec.prewake is not None else "UTC"
        stored = self._stored
        try:
            profile = Profile.decode(stored.profile, zone)
            gaps = GapHistogram.decode(stored.idle_gaps)
        except ProfileError as exc:
            log.warning("%s/%s: learning afresh: %s", self.namespace, self.name, exc)
            profile, gaps = Profile(zone=zone), GapHistogram()
        when = stored.last_prewake_time
        last = None if when is None else seconds_of(when)
        pending = None
        if last is not None and spec.prewake is not None:
            slot = prewake_policy.slot_start(last + spec.prewake.lead_seconds, zone)
            # A pre-wake still waiting for its request when the operator stopped; one whose
            # slot has ended was settled then.
            if now < slot + prewake_policy.SLOT_SECONDS:
                pending = Prewake(at=last, slot=slot)
        return Learnt(
            profile=profile,
            gaps=gaps,
            pending=pending,
            last_slot=None if last is None else prewake_policy.slot_start(last + _lead(spec), zone),
            last_prewake=last,
            prewakes=stored.prewakes,
            hits=stored.hits,
            misses=stored.misses,
        )

    def learns(self, spec: InferenceModelSpec) -> bool:
        return spec.prewake is not None or spec.idle.after == AUTO

    def decide(
        self,
        spec: InferenceModelSpec,
        *,
        memory: ModelMemory,
        wake_requested: float | None,
        asleep: bool,
        now: float,
    ) -> tuple[InferenceModelSpec, float | None]:
        """The spec and the wake request that the sleep and scale decisions should read now."""
        self._edges(spec, now)
        learnt = self.learnt
        if learnt is None or learnt.profile.zone != _zone(spec):
            learnt = self.learnt = self._restore(spec, now)
        if self.learns(spec):
            learnt = self._observe(learnt, memory, wake_requested, now)
        if spec.prewake is not None:
            before = learnt
            learnt, fire = learnt.tick(now, lead=spec.prewake.lead_seconds, asleep=asleep)
            self._count(before, learnt)
            if fire and learnt.pending is not None:
                self.emit(
                    "Normal",
                    EventReason.PREWAKE,
                    f"woken ahead of the requests expected from {format_time(learnt.pending.slot)} "
                    f"(prewake.lead {spec.prewake.lead})",
                )
        self.learnt = learnt
        effective = schedule_policy.with_schedule(
            prewake_policy.effective_spec(spec, learnt.gaps), now
        )
        # A pre-wake is a wake request of the operator's own: the same decision wakes the model
        # and keeps it awake for its idle period, as after a request.
        last = learnt.last_prewake if spec.prewake is not None else None
        if last is not None and (wake_requested is None or last > wake_requested):
            wake_requested = last
        return effective, wake_requested

    def _observe(
        self, learnt: Learnt, memory: ModelMemory, wake_requested: float | None, now: float
    ) -> Learnt:
        """Learn from what the probes saw: a wake request from the gateway (a request that
        found the model asleep, at the annotation's time), and requests finishing (an engine's
        success counter moved) or running, at the probe's time."""
        served = sum(e.success_total or 0.0 for e in memory.engines.values())
        busy = any(e.busy for e in memory.engines.values())
        if self.requests_seen is None:
            # The first cycle of this process: what is there now is the past.
            self.requests_seen, self.wake_seen = served, wake_requested
            self.activity_seen = memory.last_activity or now
            return learnt
        before = learnt
        seen = self.activity_seen
        if wake_requested is not None and (
            self.wake_seen is None or wake_requested > self.wake_seen
        ):
            # The gateway asks for a wake only when it found no awake engine.
            learnt = learnt.request(wake_requested, idle_since=seen, found_asleep=True)
            self.wake_seen = self.activity_seen = wake_requested
        elif served > self.requests_seen or busy:
            # One quiet probe at least between two active ones makes an idle gap; active
            # probes in a row are one stretch of work.
            quiet = seen is not None and now - seen > self.gap_floor
            learnt = learnt.request(now, idle_since=seen if quiet else None, found_asleep=False)
            self.activity_seen = now
        self.requests_seen = served
        self._count(before, learnt)
        return learnt

    def _count(self, before: Learnt, after: Learnt) -> None:
        labels = (self.namespace, self.name)
        for metric, delta in (
            (self.metrics.prewakes, after.prewakes - before.prewakes),
            (self.metrics.prewake_hits, after.hits - before.hits),
            (self.metrics.prewake_misses, after.misses - before.misses),
        ):
            if delta > 0:
                metric.labels(*labels).inc(delta)

    def _edges(self, spec: InferenceModelSpec, now: float) -> None:
        """An Event when a window begins or ends."""
        window = schedule_policy.active(spec.schedule, now)
        self.metrics.window_active.labels(self.namespace, self.name).set(1 if window else 0)
        current = ToldWindow(name=window.name, end=window.end) if window is not None else None
        told = self.window
        if current == told or (current is not None and told is not None and current.same(told)):
            return
        if told is not None and (current is None or current.name != told.name):
            self.emit("Normal", EventReason.WINDOW_ENDED, f"keep-awake window {told.name} ended")
        if window is not None:
            self.emit(
                "Normal",
                EventReason.WINDOW_STARTED,
                f"keep-awake window {window.name} began: {window.min_awake} engine(s) kept "
                f"awake until {format_time(window.end)}",
            )
        self.window = current

    def report(
        self, status: InferenceModelStatus, spec: InferenceModelSpec, now: float
    ) -> InferenceModelStatus:
        """`status` with the fields this module owns."""
        prewake = None
        learnt = self.learnt
        if learnt is not None and self.learns(spec):
            chosen = ""
            if spec.idle.after == AUTO:
                chosen = prewake_policy.effective_spec(spec, learnt.gaps).idle.after
            prewake = PrewakeStatus(
                profile=learnt.profile.encode() if spec.prewake is not None else "",
                idle_gaps=learnt.gaps.encode(),
                auto_idle_after=chosen,
                last_prewake_time=None
                if learnt.last_prewake is None
                else moment(learnt.last_prewake),
                prewakes=learnt.prewakes,
                hits=learnt.hits,
                misses=learnt.misses,
            )
        return status.model_copy(
            update={
                "active_window": _window(schedule_policy.active(spec.schedule, now)),
                "next_window": _window(schedule_policy.upcoming(spec.schedule, now)),
                "prewake": prewake,
            }
        )


def _lead(spec: InferenceModelSpec) -> float:
    return spec.prewake.lead_seconds if spec.prewake is not None else 0.0


def _zone(spec: InferenceModelSpec) -> str:
    return spec.prewake.time_zone if spec.prewake is not None else "UTC"


def _window(window: schedule_policy.Window | None) -> WindowStatus | None:
    if window is None:
        return None
    return WindowStatus(
        name=window.name,
        start=moment(window.start),
        end=moment(window.end),
        min_awake=window.min_awake,
    )
