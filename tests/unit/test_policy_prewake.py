"""Pre-wake and idle.after: Auto (snooze.policy.prewake): the weekly profile, its learning from
hits and misses, its status form, and the keep-alive chosen from idle gaps."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from snooze.api.models import InferenceModelSpec
from snooze.policy import prewake
from snooze.policy.prewake import GapHistogram, Outcome, Prewake, Profile, ProfileError

WEEK = 7 * 86400


def at(text: str, zone: str = "UTC") -> float:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp()


def test_an_arrival_after_idleness_makes_its_slot_next_week_a_prewake() -> None:
    monday = at("2026-06-15T09:04")
    profile = Profile().arrival(monday)
    assert prewake.slot_of(monday, "UTC") == 9 * 6
    # A week on, two minutes of lead: woken at 08:58 for the 09:00 slot.
    next_week = monday + WEEK
    assert profile.next_prewake(at("2026-06-22T06:00"), 120) == at("2026-06-22T08:58")
    assert profile.due(at("2026-06-22T08:57:59"), 120) is None
    assert profile.due(at("2026-06-22T08:58"), 120) == at("2026-06-22T09:00")
    assert profile.due(next_week, 120) == at("2026-06-22T09:00")
    assert profile.due(at("2026-06-22T09:08"), 120) is None  # 09:10 is another slot
    # Tuesday at 09:00 was never seen.
    assert profile.due(at("2026-06-23T08:58"), 120) is None


def test_misses_weaken_a_slot_until_it_is_no_longer_prewoken() -> None:
    t = at("2026-06-15T09:04")
    profile = Profile().arrival(t)
    assert profile.hot(t)
    profile = profile.miss(t)  # a week with no request
    assert not profile.hot(t)
    # Requests two weeks in three keep it hot: +2 against -1.
    profile = Profile()
    for week in range(9):
        profile = profile.miss(t) if week % 3 == 2 else profile.arrival(t)
    assert profile.hot(t)
    assert max(profile.strengths) == 8
    for _ in range(20):
        profile = profile.arrival(t)
    assert max(profile.strengths) == prewake.LEVELS - 1  # bounded: one digit


def test_the_profile_follows_the_local_clock_through_dst() -> None:
    # 09:00 in Paris is 07:00 UTC in summer and 08:00 UTC in winter: the same slot.
    summer = at("2026-06-15T09:04", "Europe/Paris")
    profile = Profile(zone="Europe/Paris").arrival(summer)
    winter_monday = at("2026-11-02T08:58", "Europe/Paris")
    assert profile.due(winter_monday, 120) == at("2026-11-02T09:00", "Europe/Paris")
    # In a zone 5h45 from UTC, slot boundaries still fall on the local ten minutes.
    kathmandu = Profile(zone="Asia/Kathmandu").arrival(at("2026-06-15T09:04", "Asia/Kathmandu"))
    nxt = kathmandu.next_prewake(at("2026-06-21T00:00"), 60)
    assert nxt == at("2026-06-22T08:59", "Asia/Kathmandu")


def test_hit_and_miss() -> None:
    pending = Prewake(at=1000.0, slot=1120.0)
    assert pending.outcome(None, 1500.0) is None
    assert pending.outcome(1200.0, 1500.0) is Outcome.HIT
    assert pending.outcome(900.0, 1500.0) is None  # that request came before the pre-wake
    assert pending.outcome(900.0, 1120.0 + prewake.SLOT_SECONDS) is Outcome.MISS


def test_the_profile_round_trips_through_its_status_form() -> None:
    profile = Profile(zone="Europe/Paris").arrival(at("2026-06-15T09:04")).arrival(0.0)
    text = profile.encode()
    assert len(text) == prewake.SLOTS == 1008
    assert Profile.decode(text, "Europe/Paris") == profile
    assert Profile.decode("", "UTC") == Profile()
    with pytest.raises(ProfileError, match="1008 digits"):
        Profile.decode("12x", "UTC")


@settings(max_examples=100, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.booleans(), st.floats(min_value=1.7e9, max_value=1.8e9)), max_size=60
    ),
    now=st.floats(min_value=1.7e9, max_value=1.8e9),
    lead=st.floats(min_value=0, max_value=3600),
)
# A slot hot at 02:00 on the Sunday a week before New York's clocks go back, seen just over an
# hour before: its next instance is a week and an hour of real time away (found by this test).
@example(events=[(True, 1792908000.0)], now=1792905000.0, lead=3600.0)
def test_profile_properties(events: list[tuple[bool, float]], now: float, lead: float) -> None:
    profile = Profile(zone="America/New_York")
    for arrival, t in events:
        profile = profile.arrival(t) if arrival else profile.miss(t)
    assert all(0 <= s < prewake.LEVELS for s in profile.strengths)
    assert Profile.decode(profile.encode(), profile.zone) == profile
    nxt = profile.next_prewake(now, lead)
    if not any(s >= prewake.HOT for s in profile.strengths):
        assert nxt is None
    else:
        week = (prewake.SLOTS + prewake.CLOCK_CHANGE_SLOTS) * prewake.SLOT_SECONDS
        assert nxt is not None and now <= nxt <= now + week
        slot = profile.due(nxt, lead)
        assert slot is not None and slot <= nxt + lead < slot + prewake.SLOT_SECONDS
        # Nothing is due before it (checked on a few instants between).
        for k in range(1, 5):
            earlier = now + (nxt - now) * k / 5
            if earlier < nxt - 1e-6:
                assert profile.due(earlier, lead) is None


def gaps(*minutes: float) -> GapHistogram:
    histogram = GapHistogram()
    for m in minutes:
        histogram = histogram.add(m * 60)
    return histogram


def test_auto_keep_alive_covers_the_99th_percentile_of_gaps() -> None:
    # Requests every few seconds in bursts, the bursts 3 to 4 minutes apart.
    histogram = gaps(*([0.1] * 200), *([3.5] * 20))
    # 99% of 220 gaps are within 4 minutes: a 4m24s keep-alive (a 10% margin).
    assert histogram.keep_alive(60, 1800) == pytest.approx(4 * 60 * 1.1)
    assert histogram.keep_alive(600, 1800) == 600  # the user's bounds win
    assert histogram.keep_alive(60, 120) == 120


def test_auto_falls_back_to_the_longest_keep_alive_without_a_pattern() -> None:
    assert gaps(1, 2, 3).keep_alive(60, 1800) == 1800  # too few gaps
    assert gaps(*([300] * 30)).keep_alive(60, 1800) == 1800  # mostly longer than 4 hours
    assert gaps(*range(0, 240, 8)).keep_alive(60, 1800) == 1800  # spread evenly


def test_the_gap_histogram_stays_bounded_and_round_trips() -> None:
    histogram = gaps(*([0.5] * 1500), 300)
    assert histogram.total <= prewake.GAP_MAX_SAMPLES
    assert GapHistogram.decode(histogram.encode()) == histogram
    with pytest.raises(ProfileError):
        GapHistogram.decode("999:1")


def test_effective_spec_replaces_auto_with_the_chosen_keep_alive() -> None:
    spec = InferenceModelSpec.model_validate(
        {
            "selector": {"matchLabels": {"app": "m"}},
            "idle": {"after": "Auto", "auto": {"min": "2m", "max": "20m"}},
        }
    )
    assert spec.idle_after_seconds == 1200  # before anything is learnt: the longest
    chosen = prewake.effective_spec(spec, gaps(*([0.1] * 200), *([3.5] * 20)))
    assert chosen.idle.after == "264s" and chosen.idle_after_seconds == 264
    fixed = spec.model_copy(update={"idle": spec.idle.model_copy(update={"after": "5m"})})
    assert prewake.effective_spec(fixed, GapHistogram()) is fixed


def test_auto_with_scale_to_zero_must_leave_room_for_the_longest_keep_alive() -> None:
    base = {
        "selector": {"matchLabels": {"app": "m"}},
        "scaleTargetRef": {"kind": "Deployment", "name": "m"},
        "idle": {"after": "Auto", "auto": {"max": "1h"}},
    }
    with pytest.raises(Exception, match=r"longer than idle.auto.max \(1h\)"):
        InferenceModelSpec.model_validate({**base, "scaleToZeroAfter": "30m"})
    assert InferenceModelSpec.model_validate({**base, "scaleToZeroAfter": "2h"})
    with pytest.raises(Exception, match="must not be longer than max"):
        InferenceModelSpec.model_validate(
            {**base, "idle": {"after": "Auto", "auto": {"min": "2h", "max": "1h"}}}
        )


def slow_next_prewake(profile: Profile, now: float, lead: float) -> float | None:
    """The search as first written: every slot boundary of the week ahead, one at a time."""
    if profile.due(now, lead) is not None:
        return now
    boundary = prewake.slot_start(now + lead, profile.zone) + prewake.SLOT_SECONDS
    for _ in range(prewake.SLOTS + 1 + prewake.CLOCK_CHANGE_SLOTS):
        if profile.hot(boundary):
            return boundary - lead
        boundary += prewake.SLOT_SECONDS
    return None


@settings(max_examples=300, deadline=None)
@given(
    zone=st.sampled_from(
        ["UTC", "America/New_York", "Europe/Paris", "Australia/Lord_Howe", "Asia/Kathmandu"]
    ),
    hot=st.lists(st.integers(min_value=0, max_value=prewake.SLOTS - 1), max_size=8),
    now=st.floats(min_value=1.7e9, max_value=1.8e9),
    lead=st.floats(min_value=0, max_value=7200),
)
# Around New York's and Lord Howe's (half an hour) clock changes.
@example(zone="America/New_York", hot=[6 * 144 + 12], now=1792905000.0, lead=3600.0)
@example(zone="Australia/Lord_Howe", hot=[6 * 144 + 12, 3], now=1775318400.0, lead=600.0)
@example(zone="Europe/Paris", hot=[6 * 144 + 13], now=1774731000.0, lead=60.0)
def test_the_jumping_search_finds_what_the_slot_by_slot_one_found(
    zone: str, hot: list[int], now: float, lead: float
) -> None:
    strengths = [0] * prewake.SLOTS
    for slot in hot:
        strengths[slot] = prewake.HOT
    profile = Profile(zone=zone, strengths=tuple(strengths))
    assert profile.next_prewake(now, lead) == slow_next_prewake(profile, now, lead)
