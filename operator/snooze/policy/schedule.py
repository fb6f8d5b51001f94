"""Keep-awake windows placed in time: which window is in force at an instant, which starts next,
and the edges between two instants; pure (the clock is an argument)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

from cronsim import CronSim

from snooze.api.keepawake import ScheduleWindow
from snooze.api.models import InferenceModelSpec


@dataclass(frozen=True, kw_only=True)
class Window:
    """One occurrence of a keep-awake window, in seconds since the epoch."""

    name: str
    start: float
    end: float
    min_awake: int

    def covers(self, now: float) -> bool:
        return self.start <= now < self.end


@dataclass(frozen=True, kw_only=True)
class Edge:
    """A window starting or ending, for Events and for a simulation's clock."""

    at: float
    starts: bool
    window: Window


@cache
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _local(now: float, zone: str) -> datetime:
    # Whole seconds: cron fires on them, and cronsim treats microseconds as "after that second".
    return datetime.fromtimestamp(int(now // 1), _zone(zone))


def _occurrence(spec: ScheduleWindow, start: datetime) -> Window:
    # A window lasts its duration in real time: one of 10h over a DST change still lasts 10h.
    begin = start.timestamp()
    return Window(
        name=spec.label,
        start=begin,
        end=begin + spec.duration_seconds,
        min_awake=spec.min_awake,
    )


def latest_start(spec: ScheduleWindow, now: float) -> Window:
    """The occurrence of `spec` that started last at or before `now`."""
    # cronsim's reverse iteration yields times strictly before its start: start one second on.
    after = _local(now, spec.time_zone) + timedelta(seconds=1)
    return _occurrence(spec, next(CronSim(spec.cron, after, reverse=True)))


def starts_after(spec: ScheduleWindow, now: float) -> Iterator[Window]:
    """The occurrences of `spec` that start strictly after `now`, in order."""
    for start in CronSim(spec.cron, _local(now, spec.time_zone)):
        yield _occurrence(spec, start)


def in_force(windows: Sequence[ScheduleWindow], now: float) -> list[Window]:
    """Every window that covers `now` (windows may overlap)."""
    found = []
    for spec in windows:
        occurrence = latest_start(spec, now)
        if occurrence.covers(now):
            found.append(occurrence)
    return found


def active(windows: Sequence[ScheduleWindow], now: float) -> Window | None:
    """The window in force at `now` that keeps the most engines awake (the one ending last
    among equals); None outside every window."""
    found = in_force(windows, now)
    if not found:
        return None
    return max(found, key=lambda w: (w.min_awake, w.end, w.name))


def upcoming(windows: Sequence[ScheduleWindow], now: float) -> Window | None:
    """The next window to start after `now`; None without windows."""
    starts = [next(starts_after(spec, now)) for spec in windows]
    return min(starts, key=lambda w: (w.start, w.name)) if starts else None


def min_awake(spec: InferenceModelSpec, now: float) -> int:
    """Engines to keep awake at `now`: spec.minAwake, or the window in force when it asks more."""
    window = active(spec.schedule, now)
    return max(spec.min_awake, window.min_awake if window is not None else 0)


def with_schedule(spec: InferenceModelSpec, now: float) -> InferenceModelSpec:
    """The spec the sleep and scale decisions read at `now`: minAwake raised by the window in
    force, so that its engines are woken (or scaled up) and not slept below it."""
    if not spec.schedule:
        return spec
    floor = min_awake(spec, now)
    return spec if floor == spec.min_awake else spec.model_copy(update={"min_awake": floor})


def bounded(spec: InferenceModelSpec, engines: int) -> InferenceModelSpec:
    """The spec with minAwake (raised by a window, or the spec's own) bounded by the engines
    the model can have (`engines`, at least one: a window still scales a model at zero back
    up). A floor beyond them keeps no more engines awake; in a GPU pool it would only count as
    a claim on its neighbours' room that no engine of the model takes up."""
    floor = min(spec.min_awake, max(engines, 1))
    return spec if floor == spec.min_awake else spec.model_copy(update={"min_awake": floor})


def edges(windows: Sequence[ScheduleWindow], since: float, until: float) -> list[Edge]:
    """Window starts and ends in (since, until], in order: the instants something changes."""
    found: list[Edge] = []
    for spec in windows:
        # Windows that started before `since` may still end inside the span (a window may
        # last longer than the time between its starts).
        occurrences = []
        after = _local(since, spec.time_zone) + timedelta(seconds=1)
        for start in CronSim(spec.cron, after, reverse=True):
            occurrence = _occurrence(spec, start)
            if occurrence.end <= since:
                break
            occurrences.append(occurrence)
        for occurrence in starts_after(spec, since):
            if occurrence.start > until:
                break
            occurrences.append(occurrence)
        for occurrence in occurrences:
            if since < occurrence.start <= until:
                found.append(Edge(at=occurrence.start, starts=True, window=occurrence))
            if since < occurrence.end <= until:
                found.append(Edge(at=occurrence.end, starts=False, window=occurrence))
    found.sort(key=lambda e: (e.at, e.starts, e.window.name))
    return found
