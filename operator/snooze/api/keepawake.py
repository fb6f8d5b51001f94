"""The API types of keep-awake schedules, pre-wake and the automatic keep-alive (`idle.after:
Auto`): spec fields users write and the status the operator keeps of what it learnt."""

from __future__ import annotations

import heapq
import itertools
import zoneinfo
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated

from cronsim import CronSim, CronSimError
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from snooze.api.durations import DURATION_PATTERN, parse_duration
from snooze.api.times import Time

# The same wire conventions as the InferenceModel's own types (models.Wire), which import these.
_WIRE = ConfigDict(
    alias_generator=to_camel,
    populate_by_name=True,
    extra="forbid",
    frozen=True,
    use_attribute_docstrings=True,
)
_STATUS = ConfigDict(
    alias_generator=to_camel, populate_by_name=True, extra="ignore", use_attribute_docstrings=True
)
MAX_WINDOWS = 16
MIN_WINDOW_PERIOD = timedelta(minutes=10)
"""The shortest time between two starts of a model's keep-awake windows, one window's or
several's. Each start wakes the model and, in a GPU pool, puts a neighbour to sleep for it: a
window every few seconds made the neighbours sleep and wake many times a minute, and sixteen
windows ten minutes apart each could start one every 37.5 s. Windows closer than this are a
model that should stay awake (minAwake), or one long window. Windows that start at the same
instant start once."""
GAP_SAMPLE = 64
GAP_SPAN = timedelta(days=8)  # a week of weekday patterns, and the day after
# A week of 10-minute slots: fine enough to wake a couple of minutes before a habit, coarse
# enough that one week of traffic fills it and its status entry stays about a kilobyte.
PROFILE_SLOT_MINUTES = 10
WALK_LIMIT = 4096
"""The most starts of a model's windows walked in time order (the starts of GAP_SPAN, at most
1,152 instants MIN_WINDOW_PERIOD apart, some shared by several windows)."""


def _positive(text: str) -> str:
    if parse_duration(text) <= 0:
        raise ValueError(f"{text!r} must be longer than zero, such as '30s' or '10m'")
    return text


Duration = Annotated[
    str,
    Field(pattern=DURATION_PATTERN, max_length=32, json_schema_extra={"example": "10m"}),
    AfterValidator(_positive),
]


def _cron(text: str) -> str:
    try:
        starts = CronSim(text, datetime(2000, 1, 1))
        gap = shortest_gap(starts)
    except CronSimError as exc:
        raise ValueError(
            f"{text!r} is not a cron expression ({exc}): write five fields, minute hour "
            "day-of-month month day-of-week, such as '0 8 * * MON-FRI' (six: seconds first)"
        ) from None
    if gap is not None and gap < MIN_WINDOW_PERIOD:
        raise ValueError(
            f"{text!r} starts a window every {_seconds(gap)}: keep-awake windows must start at "
            f"least {_seconds(MIN_WINDOW_PERIOD)} apart (each start wakes the model, and in a GPU "
            "pool puts a neighbour to sleep for it). To keep engines awake all the time, set "
            "spec.minAwake; for a long window, give it a longer duration"
        )
    return text


def shortest_gap(starts: Iterator[datetime]) -> timedelta | None:
    """The shortest time between two consecutive starts among the first GAP_SAMPLE of them,
    or within GAP_SPAN of the first (None: fewer than two). Cron's fields repeat every matching
    day, so its shortest gaps are among them."""
    first = previous = next(starts, None)
    shortest: timedelta | None = None
    for _ in range(GAP_SAMPLE):
        start = next(starts, None)
        if first is None or previous is None or start is None or start - first > GAP_SPAN:
            break
        gap = start - previous
        shortest = gap if shortest is None else min(shortest, gap)
        if shortest < MIN_WINDOW_PERIOD:
            break
        previous = start
    return shortest


def _seconds(gap: timedelta) -> str:
    seconds = int(gap.total_seconds())
    return f"{seconds // 60}m" if seconds % 60 == 0 and seconds >= 60 else f"{seconds}s"


def _zone(text: str) -> str:
    try:
        zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"{text!r} is not an IANA time zone: write one such as 'UTC', 'Europe/Paris' or "
            "'America/New_York'"
        ) from None
    return text


Cron = Annotated[
    str,
    Field(min_length=9, max_length=128, json_schema_extra={"example": "0 8 * * MON-FRI"}),
    AfterValidator(_cron),
]
TimeZone = Annotated[
    str,
    Field(min_length=1, max_length=64, json_schema_extra={"example": "Europe/Paris"}),
    AfterValidator(_zone),
]


class ScheduleWindow(BaseModel):
    """A time during which the model is kept awake, whatever its traffic."""

    model_config = _WIRE

    name: str = Field(default="", max_length=63, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$")
    """A name for the status and Events; default: the cron expression."""
    cron: Cron
    """When each window starts: minute hour day-of-month month day-of-week, in timeZone, such
    as '0 8 * * MON-FRI' (six fields: seconds first), at least 10 minutes apart. Cron's own
    rules: a start in an hour that a DST change skips runs when the clock jumps; one in an
    hour that repeats runs once."""
    duration: Duration
    """How long each window lasts, such as 10h."""
    time_zone: TimeZone = "UTC"
    """The IANA time zone the cron expression is read in, such as Europe/Paris."""
    min_awake: int = Field(default=1, ge=1, le=10000)
    """Engines kept awake during the window (woken at its start, scaled up from zero if
    needed); spec.minAwake applies when it is larger."""

    @property
    def label(self) -> str:
        return self.name or self.cron

    @property
    def duration_seconds(self) -> float:
        return parse_duration(self.duration)


def _apart(windows: list[ScheduleWindow]) -> list[ScheduleWindow]:
    clash = closest_starts(windows)
    if clash is not None:
        (first, at), (second, then) = clash
        raise ValueError(
            f"windows {first.label!r} and {second.label!r} start {_seconds(then - at)} apart "
            f"(at {at:%a %H:%M:%S} and {then:%a %H:%M:%S} UTC): the starts of a model's "
            f"keep-awake windows, all of them together, must be at least "
            f"{_seconds(MIN_WINDOW_PERIOD)} apart (each start wakes the model). Merge them "
            "into one longer window, or move one"
        )
    return windows


def _utc_starts(window: ScheduleWindow, begin: datetime) -> Iterator[datetime]:
    local = begin.astimezone(zoneinfo.ZoneInfo(window.time_zone)).replace(microsecond=0)
    for start in CronSim(window.cron, local):
        yield start.astimezone(UTC)


def closest_starts(
    windows: Sequence[ScheduleWindow],
) -> tuple[tuple[ScheduleWindow, datetime], tuple[ScheduleWindow, datetime]] | None:
    """Two starts of different windows closer than MIN_WINDOW_PERIOD (and not at the same
    instant), if any: every start of GAP_SPAN walked in time order, each window's own gaps
    being checked apart (its cron field); then each window's first start, if it comes later
    (a window on the 15th of the month), against the others' starts around it. The walk
    stops at a clash: starts MIN_WINDOW_PERIOD apart are at most GAP_SPAN / that many."""
    # Windows with the same cron expression in the same zone start together: walked once.
    unique: dict[tuple[str, str], ScheduleWindow] = {}
    for window in windows:
        unique.setdefault((window.cron, window.time_zone), window)
    windows = list(unique.values())
    if len(windows) < 2:
        return None
    begin = datetime(2000, 1, 1, tzinfo=UTC)
    end = begin + GAP_SPAN
    walk = heapq.merge(
        *(((at, i) for at in _utc_starts(w, begin)) for i, w in enumerate(windows)),
    )
    seen: set[int] = set()
    previous: tuple[datetime, int] | None = None
    # At most WALK_LIMIT starts: windows that start at the same instants (allowed) repeat them.
    for at, i in itertools.islice(itertools.takewhile(lambda f: f[0] <= end, walk), WALK_LIMIT):
        seen.add(i)
        if previous is not None and previous[1] != i:
            gap = at - previous[0]
            if timedelta(0) < gap < MIN_WINDOW_PERIOD:
                return (windows[previous[1]], previous[0]), (windows[i], at)
        if previous is None or at != previous[0] or previous[1] == i:
            previous = (at, i)
    for i, window in enumerate(windows):
        if i in seen:
            continue
        first = next(_utc_starts(window, begin), None)
        if first is None:
            continue
        for j, other in enumerate(windows):
            near = next(_utc_starts(other, first - MIN_WINDOW_PERIOD), None)
            if j != i and near is not None and near != first and near - first < MIN_WINDOW_PERIOD:
                pair = sorted([(near, j), (first, i)])
                return (windows[pair[0][1]], pair[0][0]), (windows[pair[1][1]], pair[1][0])
    return None


Schedule = Annotated[list[ScheduleWindow], Field(max_length=MAX_WINDOWS), AfterValidator(_apart)]
"""A model's keep-awake windows: at most MAX_WINDOWS, their starts MIN_WINDOW_PERIOD apart."""


class PrewakeSpec(BaseModel):
    """Wake a sleeping model shortly before the requests its own traffic says are likely."""

    model_config = _WIRE

    lead: Duration = "2m"
    """How long before a likely request the model is woken (a wake must be done by then)."""
    time_zone: TimeZone = "UTC"
    """The time zone of the weekly profile: habits follow the local clock through DST changes."""

    @property
    def lead_seconds(self) -> float:
        return parse_duration(self.lead)


class AutoIdleSpec(BaseModel):
    """Bounds of the keep-alive that `idle.after: Auto` chooses from the model's idle gaps."""

    model_config = _WIRE

    min: Duration = "1m"
    """The shortest keep-alive Auto may choose."""
    max: Duration = "30m"
    """The longest keep-alive Auto may choose; also used until enough gaps are seen."""

    @model_validator(mode="after")
    def _in_order(self) -> AutoIdleSpec:
        if parse_duration(self.min) > parse_duration(self.max):
            raise ValueError(f"min ({self.min}) must not be longer than max ({self.max})")
        return self

    @property
    def min_seconds(self) -> float:
        return parse_duration(self.min)

    @property
    def max_seconds(self) -> float:
        return parse_duration(self.max)


class WindowStatus(BaseModel):
    """A keep-awake window as the operator placed it in time."""

    model_config = _STATUS

    name: str
    """The window's name (or its cron expression)."""
    start: Time
    """When it starts (or started)."""
    end: Time
    """When it ends."""
    min_awake: int = 1
    """Engines it keeps awake."""


class PrewakeStatus(BaseModel):
    """What the operator learnt of the model's traffic, kept here so that a restart keeps it."""

    model_config = _STATUS

    profile: str = ""
    """One character per 10-minute slot of the week (Monday 00:00 first, in prewake.timeZone):
    0 to 9, how strongly requests are expected there after idleness."""
    idle_gaps: str = ""
    """The idle-gap histogram that idle.after: Auto reads: counts per bin, comma-separated."""
    auto_idle_after: str = ""
    """The keep-alive idle.after: Auto chose last."""
    last_prewake_time: Time | None = None
    """When the operator last woke the model ahead of its traffic."""
    prewakes: int = 0
    """Pre-wakes so far."""
    hits: int = 0
    """Pre-wakes that a request followed."""
    misses: int = 0
    """Pre-wakes that no request followed (each one weakens its slot)."""
