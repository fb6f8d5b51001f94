"""When an engine is probed: a table, and properties that keep the sleep decisions safe."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snooze.api.models import EngineState
from snooze.policy.probing import (
    Ledger,
    Pending,
    Probed,
    ProbeFacts,
    Seen,
    Traffic,
    probe_due,
    seen,
)

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
        (
            "a pool member no gateway counters follow: every interval",
            facts(followed=True),
            True,
        ),
        (
            "a pool member so followed, probed a moment ago",
            facts(followed=True, last_probe=NOW - 2),
            False,
        ),
        (
            "a pool member so followed, asleep",
            facts(followed=True, sleeping=True, label=ASLEEP),
            False,
        ),
        ("found stuck by a gateway since its last probe", facts(stalled=True), True),
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
    followed=st.booleans(),
    stalled=st.booleans(),
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


def probed(in_flight: int = 0, total: float | None = 0, at: float = NOW) -> Probed:
    return Probed(in_flight=in_flight, total=total, at=at)


def judged(
    *,
    probe: Probed | None = None,
    previous_total: float | None = 0,
    traffic: Traffic | None = None,
    ledger: Ledger | None = None,
    direct_before: bool = False,
    last_activity: float = NOW - 100,
) -> Seen:
    return seen(
        now=NOW,
        last_activity=last_activity,
        probe=probe,
        previous_total=previous_total,
        traffic=traffic,
        ledger=ledger,
        direct_before=direct_before,
    )


def counts(sent: float, in_flight: int = 0, last: float | None = None, at: float = NOW) -> Traffic:
    return Traffic(sent=sent, in_flight=in_flight, last=last, at=at)


def test_without_the_gateways_counters_all_activity_is_the_engines_own() -> None:
    busy = judged(probe=probed(in_flight=2))
    assert busy == Seen(busy=True, direct_activity=True, last_activity=NOW, ledger=None)
    done = judged(probe=probed(total=3))
    assert done == Seen(busy=False, direct_activity=True, last_activity=NOW, ledger=None)
    idle = judged(probe=probed())
    assert idle == Seen(busy=False, direct_activity=False, last_activity=NOW - 100, ledger=None)


def test_not_probed_and_no_counters_keeps_what_was_known() -> None:
    kept = judged(direct_before=True)
    assert kept == Seen(busy=True, direct_activity=True, last_activity=NOW - 100, ledger=None)


def test_the_gateways_counters_date_activity_between_probes() -> None:
    # Not probed this cycle: the gateway alone says the engine served until 3 s ago.
    quiet = judged(traffic=counts(9, last=NOW - 3))
    assert (quiet.busy, quiet.direct_activity, quiet.last_activity) == (False, False, NOW - 3)
    streaming = judged(traffic=counts(9, in_flight=1))
    assert (streaming.busy, streaming.last_activity) == (True, NOW)


def test_a_gateway_clock_ahead_never_dates_activity_in_the_future() -> None:
    assert judged(traffic=counts(9, last=NOW + 50)).last_activity == NOW


def test_what_the_gateway_sent_is_dated_by_the_gateway() -> None:
    base = Ledger(engine_total=100, gateway_sent=40)
    # 5 finished since the baseline, 5 sent by the gateway since: all explained.
    result = judged(
        probe=probed(total=105, at=NOW),
        previous_total=100,
        traffic=counts(45, last=NOW - 7, at=NOW - 1),
        ledger=base,
    )
    assert (result.busy, result.direct_activity, result.last_activity) == (False, False, NOW - 7)


def test_a_request_the_last_scrape_has_not_seen_yet_is_activity_now() -> None:
    # The engine finished one more than the (older) scrape accounts for: maybe the gateway's,
    # maybe not; for the sleep decision it is activity now, but not yet judged direct.
    base = Ledger(engine_total=100, gateway_sent=40)
    result = judged(
        probe=probed(total=106),
        previous_total=100,
        traffic=counts(45, last=NOW - 7, at=NOW - 1),
        ledger=base,
    )
    assert result.last_activity == NOW and not result.direct_activity
    assert result.ledger == Ledger(
        engine_total=100,
        gateway_sent=40,
        pending=Pending(engine_total=106, probed_at=NOW, gateway_sent=45),
    )
    # The next scrape, after the probe, saw the gateway's sixth request: not direct.
    later = seen(
        now=NOW + 10,
        last_activity=result.last_activity,
        probe=None,
        previous_total=106,
        traffic=counts(46, last=NOW - 0.5, at=NOW + 2),
        ledger=result.ledger,
        direct_before=False,
    )
    assert not later.direct_activity
    assert later.ledger == Ledger(engine_total=106, gateway_sent=45)


def test_requests_the_gateway_never_sent_are_direct_traffic() -> None:
    pending = Pending(engine_total=110, probed_at=NOW - 5, gateway_sent=42)
    ledger = Ledger(engine_total=100, gateway_sent=40, pending=pending)
    # 10 finished over the span, the gateway sent 3 over a span that covers it (plus 1 in flight).
    result = judged(traffic=counts(43, in_flight=1, at=NOW - 4), ledger=ledger)
    assert result.direct_activity and result.busy
    assert result.ledger == Ledger(engine_total=110, gateway_sent=42)


def test_a_pending_probe_waits_for_a_scrape_taken_after_it() -> None:
    pending = Pending(engine_total=110, probed_at=NOW - 5, gateway_sent=42)
    ledger = Ledger(engine_total=100, gateway_sent=40, pending=pending)
    result = judged(traffic=counts(43, at=NOW - 6), ledger=ledger, direct_before=True)
    assert result.direct_activity  # not judged: what was known stays
    assert result.ledger == ledger


def test_a_counter_that_goes_back_starts_the_ledger_over() -> None:
    pending = Pending(engine_total=3, probed_at=NOW - 5, gateway_sent=42)
    ledger = Ledger(engine_total=100, gateway_sent=40, pending=pending)  # the engine restarted
    result = judged(probe=probed(total=4), previous_total=3, traffic=counts(50), ledger=ledger)
    assert result.ledger == Ledger(engine_total=4, gateway_sent=50)


def test_more_requests_in_the_engine_than_the_gateway_has_in_flight_keep_it_busy() -> None:
    result = judged(probe=probed(in_flight=3), traffic=counts(4, in_flight=1, last=NOW - 50))
    assert result.busy and result.last_activity == NOW


TRAFFIC = st.builds(
    Traffic,
    sent=st.floats(0, 1e6),
    in_flight=st.integers(0, 100),
    last=st.none() | st.floats(NOW - 1000, NOW + 1000),
    at=st.floats(NOW - 100, NOW + 100),
)
PROBED = st.builds(
    Probed,
    in_flight=st.integers(0, 100),
    total=st.none() | st.floats(0, 1e6),
    at=st.floats(NOW, NOW + 5),
)
LEDGER = st.none() | st.builds(
    Ledger,
    engine_total=st.floats(0, 1e6),
    gateway_sent=st.floats(0, 1e6),
    pending=st.none()
    | st.builds(
        Pending,
        engine_total=st.floats(0, 1e6),
        probed_at=st.floats(NOW - 100, NOW),
        gateway_sent=st.floats(0, 1e6),
    ),
)


@given(
    st.none() | PROBED,
    st.none() | st.floats(0, 1e6),
    st.none() | TRAFFIC,
    LEDGER,
    st.booleans(),
    st.floats(NOW - 1000, NOW),
)
def test_activity_is_never_forgotten_and_a_busy_engine_is_never_idle(
    probe: Probed | None,
    previous_total: float | None,
    traffic: Traffic | None,
    ledger: Ledger | None,
    direct_before: bool,
    last_activity: float,
) -> None:
    result = judged(
        probe=probe,
        previous_total=previous_total,
        traffic=traffic,
        ledger=ledger,
        direct_before=direct_before,
        last_activity=last_activity,
    )
    assert last_activity <= result.last_activity <= NOW
    if (probe is not None and probe.in_flight) or (traffic is not None and traffic.in_flight):
        assert result.busy and result.last_activity == NOW
    if (
        probe is not None
        and probe.total is not None
        and previous_total is not None
        and probe.total > previous_total
        and (traffic is None or ledger is None)
    ):
        # Requests finished since the last probe, that nothing accounts for: activity now.
        assert result.last_activity == NOW
