"""When an engine is probed: a table, and properties that keep the sleep decisions safe."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snooze.models import EngineState
from snooze.policy.probing import ProbeFacts, Seen, Traffic, probe_due, seen

NOW = 1_000_000.0
INTERVAL, DRIFT, IDLE = 10.0, 60.0, 600.0
AWAKE, ASLEEP = EngineState.AWAKE, EngineState.ASLEEP


def facts(**kw: object) -> ProbeFacts:
    base = ProbeFacts(
        last_probe=NOW - 15,
        answered=True,
        sleeping=False,
        label=AWAKE,
        direct_activity=False,
        last_activity=NOW - 100,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def due(f: ProbeFacts, idle_after: float = IDLE) -> bool:
    return probe_due(f, idle_after=idle_after, now=NOW, interval=INTERVAL, drift=DRIFT)


@pytest.mark.parametrize(
    ("case", "f", "expected"),
    [
        ("never probed", facts(last_probe=None), True),
        ("last probe unanswered", facts(answered=False), True),
        ("awake, idle deadline far, gateway says so", facts(), False),
        ("awake, deadline within an interval", facts(last_activity=NOW - IDLE + 5), True),
        ("awake, deadline passed", facts(last_activity=NOW - IDLE - 30), True),
        (
            "awake, deadline near, probed a moment ago",
            facts(last_probe=NOW - 2, last_activity=NOW - IDLE),
            False,
        ),
        ("direct traffic: followed every interval", facts(direct_activity=True), True),
        (
            "direct traffic, probed a moment ago",
            facts(direct_activity=True, last_probe=NOW - 2),
            False,
        ),
        (
            "asleep: only Snooze wakes it",
            facts(sleeping=True, label=ASLEEP, last_activity=NOW - 5000),
            False,
        ),
        (
            "asleep, drift interval passed",
            facts(sleeping=True, label=ASLEEP, last_probe=NOW - DRIFT),
            True,
        ),
        ("failed, asleep", facts(sleeping=True, label=EngineState.FAILED), False),
        ("label says awake, engine said asleep", facts(sleeping=True), True),
        ("label says asleep, engine said awake", facts(label=ASLEEP), True),
        ("no label yet", facts(label=None), True),
        ("a draining label without its action", facts(label=EngineState.DRAINING), True),
        ("idle.after Never: drift only", facts(last_activity=NOW - 10**9), False),
    ],
)
def test_probe_due(case: str, f: ProbeFacts, expected: bool) -> None:
    idle = float("inf") if "Never" in case else IDLE
    assert due(f, idle) is expected, case


FACTS = st.builds(
    ProbeFacts,
    last_probe=st.none() | st.floats(NOW - 200, NOW),
    answered=st.booleans(),
    sleeping=st.none() | st.booleans(),
    label=st.none() | st.sampled_from(list(EngineState)),
    direct_activity=st.booleans(),
    last_activity=st.floats(NOW - 2000, NOW),
)


@given(FACTS)
def test_an_awake_engine_near_its_deadline_is_never_left_unprobed_for_an_interval(
    f: ProbeFacts,
) -> None:
    # Whatever else holds, an awake engine that could be slept within an interval has a probe
    # at most one interval old: a sleep is never decided on older news.
    if f.last_probe is None or f.sleeping is not False:
        return
    stale = NOW - f.last_probe >= INTERVAL
    near = f.last_activity + IDLE - NOW <= INTERVAL
    if stale and near:
        assert due(f)


@given(FACTS)
def test_nothing_goes_unprobed_longer_than_the_drift_interval(f: ProbeFacts) -> None:
    if f.last_probe is not None and NOW - f.last_probe >= DRIFT:
        assert due(f)


def judged(
    *,
    in_flight: int | None = 0,
    finished: float | None = 0,
    traffic: Traffic | None = None,
    sent_since: float | None = 0,
    direct_before: bool = False,
    last_activity: float = NOW - 100,
) -> Seen:
    return seen(
        now=NOW,
        last_activity=last_activity,
        probe_in_flight=in_flight,
        probe_finished=finished,
        traffic=traffic,
        traffic_sent_since=sent_since,
        direct_before=direct_before,
    )


QUIET = Traffic(sent=0, in_flight=0, last=None)


def test_without_the_gateways_counters_all_activity_is_the_engines_own() -> None:
    busy = judged(in_flight=2)
    assert busy == Seen(busy=True, direct_activity=True, last_activity=NOW)
    done = judged(finished=3)
    assert done == Seen(busy=False, direct_activity=True, last_activity=NOW)
    idle = judged()
    assert idle == Seen(busy=False, direct_activity=False, last_activity=NOW - 100)


def test_not_probed_and_no_counters_keeps_what_was_known() -> None:
    kept = judged(in_flight=None, finished=None, direct_before=True)
    assert kept == Seen(busy=True, direct_activity=True, last_activity=NOW - 100)


def test_requests_the_gateway_sent_are_dated_by_the_gateway_and_need_no_probe() -> None:
    through = Traffic(sent=50, in_flight=0, last=NOW - 7)
    result = judged(finished=5, traffic=through, sent_since=5)
    assert result == Seen(busy=False, direct_activity=False, last_activity=NOW - 7)


def test_the_gateways_counters_date_activity_between_probes() -> None:
    # Not probed this cycle: the gateway alone says the engine served until 3 s ago.
    result = judged(
        in_flight=None, finished=None, traffic=Traffic(sent=9, in_flight=0, last=NOW - 3)
    )
    assert result == Seen(busy=False, direct_activity=False, last_activity=NOW - 3)
    streaming = judged(
        in_flight=None, finished=None, traffic=Traffic(sent=9, in_flight=1, last=None)
    )
    assert streaming == Seen(busy=True, direct_activity=False, last_activity=NOW)


def test_more_requests_in_the_engine_than_the_gateway_sent_is_direct_traffic() -> None:
    result = judged(in_flight=3, traffic=Traffic(sent=4, in_flight=1, last=NOW - 50), sent_since=0)
    assert result == Seen(busy=True, direct_activity=True, last_activity=NOW)


def test_more_requests_finished_than_the_gateway_accounts_for_is_direct_traffic() -> None:
    through = Traffic(sent=10, in_flight=1, last=NOW - 50)
    # 2 sent and ended, 1 in flight at the scrape (may have ended since): 3 explained, 4 seen.
    assert judged(finished=4, traffic=through, sent_since=2).direct_activity
    assert not judged(finished=3, traffic=through, sent_since=2).direct_activity


def test_a_probe_that_shows_nothing_unexplained_ends_direct_activity() -> None:
    result = judged(traffic=QUIET, direct_before=True)
    assert result == Seen(busy=False, direct_activity=False, last_activity=NOW - 100)


def test_between_probes_direct_activity_is_remembered() -> None:
    result = judged(in_flight=None, finished=None, traffic=QUIET, direct_before=True)
    assert result.direct_activity


TRAFFIC = st.builds(
    Traffic,
    sent=st.floats(0, 1e6),
    in_flight=st.integers(0, 100),
    last=st.none() | st.floats(NOW - 1000, NOW),
)


@given(
    st.none() | st.integers(0, 100),
    st.floats(0, 100),
    st.none() | TRAFFIC,
    st.floats(0, 100),
    st.booleans(),
    st.floats(NOW - 1000, NOW),
)
def test_activity_is_never_forgotten_and_busy_is_never_missed(
    in_flight: int | None,
    finished: float,
    traffic: Traffic | None,
    sent_since: float,
    direct_before: bool,
    last_activity: float,
) -> None:
    result = judged(
        in_flight=in_flight,
        finished=None if in_flight is None else finished,
        traffic=traffic,
        sent_since=sent_since,
        direct_before=direct_before,
        last_activity=last_activity,
    )
    assert last_activity <= result.last_activity <= NOW
    if in_flight or (traffic is not None and traffic.in_flight):
        assert result.busy  # a request in the engine or on its way: never idle
        assert result.last_activity == NOW
