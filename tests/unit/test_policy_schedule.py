"""Keep-awake windows (snooze.policy.schedule): placed in time zones, across DST changes, and
checked against a brute-force walk of the clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from snooze.api.keepawake import ScheduleWindow
from snooze.api.models import InferenceModelSpec, parse_spec
from snooze.policy import schedule
from snooze.policy import sleep as sleep_policy
from snooze.policy.scale import ScaleKind, ScaleView, decide_scale

PARIS = "Europe/Paris"


def at(text: str, zone: str = "UTC") -> float:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp()


def window(cron: str, duration: str, zone: str = "UTC", **more: Any) -> ScheduleWindow:
    return ScheduleWindow.model_validate(
        {"cron": cron, "duration": duration, "timeZone": zone, **more}
    )


def test_office_hours_in_paris() -> None:
    office = window("0 8 * * MON-FRI", "10h", PARIS, name="office", minAwake=2)
    # Tuesday 2026-06-16, 09:30 in Paris (UTC+2).
    now = at("2026-06-16T09:30", PARIS)
    found = schedule.active([office], now)
    assert found is not None
    assert found.name == "office" and found.min_awake == 2
    assert found.start == at("2026-06-16T08:00", PARIS)
    assert found.end == at("2026-06-16T18:00", PARIS)
    assert schedule.active([office], at("2026-06-16T18:00", PARIS)) is None  # end excluded
    assert schedule.active([office], at("2026-06-16T07:59:59", PARIS)) is None
    assert schedule.active([office], at("2026-06-16T08:00", PARIS)) == found  # start included
    # Friday evening: the next one is Monday morning.
    following = schedule.upcoming([office], at("2026-06-19T19:00", PARIS))
    assert following is not None and following.start == at("2026-06-22T08:00", PARIS)


def test_the_same_cron_in_two_zones_is_two_instants() -> None:
    tokyo = window("0 9 * * *", "1h", "Asia/Tokyo")
    new_york = window("0 9 * * *", "1h", "America/New_York")
    now = at("2026-01-10T00:30", "UTC")  # 09:30 in Tokyo, 19:30 the day before in New York
    assert schedule.active([tokyo], now) is not None
    assert schedule.active([new_york], now) is None
    upcoming = schedule.upcoming([tokyo, new_york], now)
    assert upcoming is not None and upcoming.start == at("2026-01-10T09:00", "America/New_York")


def test_spring_forward_a_start_in_the_skipped_hour_runs_when_the_clock_jumps() -> None:
    # 2026-03-29: Paris goes from 02:00 to 03:00. A 02:30 window starts at 03:00 (cron's rule).
    night = window("30 2 * * *", "1h", PARIS)
    upcoming = schedule.upcoming([night], at("2026-03-29T00:00", PARIS))
    assert upcoming is not None
    assert upcoming.start == at("2026-03-29T03:00", PARIS)
    assert upcoming.end - upcoming.start == 3600  # a window lasts its duration in real time


def test_fall_back_a_start_in_the_repeated_hour_runs_once() -> None:
    # 2026-10-25: Paris goes from 03:00 back to 02:00; 02:30 happens twice, the window once.
    night = window("30 2 * * *", "30m", PARIS)
    edges = schedule.edges([night], at("2026-10-24T12:00", PARIS), at("2026-10-25T12:00", PARIS))
    starts = [e for e in edges if e.starts]
    assert len(starts) == 1
    assert starts[0].at == datetime(2026, 10, 25, 0, 30, tzinfo=UTC).timestamp()


def test_a_ten_hour_window_over_a_dst_change_lasts_ten_hours() -> None:
    overnight = window("0 20 * * *", "10h", PARIS)
    found = schedule.active([overnight], at("2026-03-29T05:00", PARIS))
    assert found is not None
    assert found.end - found.start == 10 * 3600
    assert found.end == at("2026-03-29T07:00", PARIS)  # 06:00 on the clock + the lost hour


def test_overlapping_windows_the_largest_min_awake_wins() -> None:
    day = window("0 8 * * *", "10h", name="day", minAwake=1)
    peak = window("0 12 * * *", "2h", name="peak", minAwake=3)
    found = schedule.active([day, peak], at("2026-05-05T13:00"))
    assert found is not None and found.name == "peak"
    found = schedule.active([day, peak], at("2026-05-05T15:00"))
    assert found is not None and found.name == "day"


def test_a_window_longer_than_its_period_has_every_edge() -> None:
    hourly = window("0 * * * *", "90m")
    edges = schedule.edges([hourly], at("2026-05-05T10:15"), at("2026-05-05T12:15"))
    assert [(e.at, e.starts) for e in edges] == [
        (at("2026-05-05T10:30"), False),
        (at("2026-05-05T11:00"), True),
        (at("2026-05-05T11:30"), False),
        (at("2026-05-05T12:00"), True),
    ]


def spec_with(windows: list[dict[str, Any]], **more: Any) -> InferenceModelSpec:
    return InferenceModelSpec.model_validate(
        {"selector": {"matchLabels": {"app": "m"}}, "schedule": windows, **more}
    )


def test_a_window_wakes_asleep_engines_and_keeps_them_from_sleep() -> None:
    spec = spec_with([{"cron": "0 8 * * *", "duration": "1h", "minAwake": 1}])
    now = at("2026-05-05T08:00")
    asleep = sleep_policy.EngineView(
        pod="p0", ready=True, label=sleep_policy.EngineState.ASLEEP, sleeping=True, busy=False,
        last_activity=now - 86400,
    )  # fmt: skip
    model = sleep_policy.ModelView(
        spec=schedule.with_schedule(spec, now), wake_requested=None, now=now
    )
    actions = sleep_policy.decide([asleep], model)
    assert [(a.kind, a.reason) for a in actions] == [(sleep_policy.ActionKind.WAKE, "MinAwake")]
    awake = sleep_policy.EngineView(
        pod="p0", ready=True, label=sleep_policy.EngineState.AWAKE, sleeping=False, busy=False,
        last_activity=now - 86400,
    )  # fmt: skip
    during = schedule.with_schedule(spec, now + 1800)
    assert (
        sleep_policy.decide(
            [awake], sleep_policy.ModelView(spec=during, wake_requested=None, now=now + 1800)
        )
        == []
    )
    after = schedule.with_schedule(spec, now + 3600)
    actions = sleep_policy.decide(
        [awake], sleep_policy.ModelView(spec=after, wake_requested=None, now=now + 3600)
    )
    assert [a.kind for a in actions] == [sleep_policy.ActionKind.SLEEP]


def test_a_window_scales_a_model_up_from_zero() -> None:
    spec = spec_with(
        [{"cron": "0 8 * * *", "duration": "1h"}],
        scaleTargetRef={"kind": "Deployment", "name": "m"},
        scaleToZeroAfter="1h",
    )
    now = at("2026-05-05T08:00:30")
    view = ScaleView(
        spec=schedule.with_schedule(spec, now), replicas=0, scaled_from=2, scaled_at=now - 9000,
        manual_at=None, last_activity=now - 99999, all_asleep=True, wake_requested=None, now=now,
    )  # fmt: skip
    decision = decide_scale(view)
    assert decision is not None and decision.kind is ScaleKind.UP and decision.reason == "MinAwake"


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("cron", "0 25 * * *", "not a cron expression"),
        ("cron", "every morning", "not a cron expression"),
        ("timeZone", "Mars/Olympus", "not an IANA time zone"),
        ("duration", "0s", "longer than zero"),
        ("minAwake", 0, "greater than or equal to 1"),
        # Windows that start every few seconds woke a pool member, and put a neighbour to
        # sleep for it, again and again.
        ("cron", "*/4 * * * * *", "starts a window every 4s: keep-awake windows must start"),
        ("cron", "*/5 * * * *", "starts a window every 5m"),
        ("cron", "58,2 23,0 * * FRI,SAT", "every 4m"),  # Friday 23:58, then Saturday 00:02
    ],
)
def test_bad_windows_are_refused_naming_the_field(field: str, value: Any, says: str) -> None:
    raw = {"cron": "0 8 * * *", "duration": "1h", field: value}
    with pytest.raises(Exception) as caught:
        parse_spec({"selector": {"matchLabels": {"app": "m"}}, "schedule": [raw]})
    assert f"spec.schedule.0.{field}" in str(caught.value) and says in str(caught.value)


@pytest.mark.parametrize(
    "cron", ["0 8 * * MON-FRI", "*/45 * * * *", "0 */10 * * * *", "0 9 29 2 *", "0,20,40 * * * *"]
)
def test_windows_ten_minutes_apart_or_more_are_taken(cron: str) -> None:
    spec_with([{"cron": cron, "duration": "5m"}])


@pytest.mark.parametrize(
    ("windows", "says"),
    [
        # Sixteen windows, each ten minutes apart from itself, together starting every 37.5 s.
        (
            [{"cron": f"{i * 75 // 2 % 60} {i * 75 // 120} * * * *"} for i in range(16)],
            "start 37s apart",
        ),
        ([{"cron": "0 8 * * *"}, {"cron": "5 8 * * *"}], "start 5m apart"),
        # 08:00 in Paris in winter is 07:00 UTC.
        ([{"cron": "0 8 * * *", "timeZone": "Europe/Paris"}, {"cron": "5 7 * * *"}], "5m apart"),
        # A monthly window's first start comes after the week the walk covers.
        ([{"cron": "0 8 15 * *"}, {"cron": "0 18 * * *"}, {"cron": "3 8 15 * *"}], "3m apart"),
    ],
)
def test_windows_closer_than_ten_minutes_together_are_refused(
    windows: list[dict[str, Any]], says: str
) -> None:
    raw = [{"duration": "1m", **w} for w in windows]
    with pytest.raises(Exception) as caught:
        parse_spec({"selector": {"matchLabels": {"app": "m"}}, "schedule": raw})
    message = str(caught.value)
    assert "spec.schedule" in message and says in message, message
    assert "all of them together, must be at least 10m apart" in message


@pytest.mark.parametrize(
    "crons",
    [
        ["0 8 * * MON-FRI", "0 18 * * *", "0,20,40 * * * *"],
        ["*/10 * * * *"] * 16,  # the same starts: one start each time
        ["0 8 * * *", "0 8 * * *", "15 8 * * *"],
    ],
)
def test_windows_ten_minutes_apart_together_are_taken(crons: list[str]) -> None:
    spec_with([{"cron": cron, "duration": "5m"} for cron in crons])


def test_min_awake_is_bounded_by_the_engines_the_model_can_have() -> None:
    spec = spec_with([{"cron": "0 8 * * *", "duration": "1h", "minAwake": 10000}])
    at_eight = datetime(2026, 3, 2, 8, 30, tzinfo=UTC).timestamp()
    raised = schedule.with_schedule(spec, at_eight)
    assert raised.min_awake == 10000
    assert schedule.bounded(raised, 2).min_awake == 2
    assert schedule.bounded(raised, 0).min_awake == 1  # a window scales a model at zero up
    assert schedule.bounded(spec, 3) is spec  # nothing to bound: minAwake 0


def test_at_most_sixteen_windows() -> None:
    with pytest.raises(ValidationError):
        spec_with([{"cron": "0 8 * * *", "duration": "1h"}] * 17)


ZONES = [
    "UTC",
    PARIS,
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "America/Santiago",
]
CRONS = [
    "0 8 * * MON-FRI",
    "30 2 * * *",
    "*/45 * * * *",
    "15 1,3 * * SUN",
    "0 0 1 * *",
    "0 9 29 2 *",
]


@settings(max_examples=150, deadline=None)
@given(
    cron=st.sampled_from(CRONS),
    zone=st.sampled_from(ZONES),
    minutes=st.integers(min_value=1, max_value=36 * 60),
    now=st.floats(min_value=1.7e9, max_value=1.9e9),
)
def test_active_agrees_with_the_edges(cron: str, zone: str, minutes: int, now: float) -> None:
    """Whatever the zone and DST: a window is active exactly when the edges before `now` (over
    the window's longest reach) leave it open; and upcoming is the first start after `now`."""
    spec = window(cron, f"{minutes}m", zone)
    since = now - 8 * 86400
    # Count the occurrences that start inside the span: open ones have no end edge yet.
    edges = [e for e in schedule.edges([spec], since, now) if e.window.start > since]
    open_count = sum(1 if edge.starts else -1 for edge in edges)
    covering = schedule.latest_start(spec, now)
    assert (schedule.active([spec], now) is not None) == covering.covers(now)
    if covering.start > since:
        assert (open_count > 0) == covering.covers(now)
    following = schedule.upcoming([spec], now)
    assert following is not None and following.start > now
    assert schedule.latest_start(spec, following.start).start == following.start
    between = schedule.edges([spec], now, following.start - 0.5)
    assert not [e for e in between if e.starts]
