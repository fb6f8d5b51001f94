"""When an engine is probed: a table, and properties that keep the sleep decisions safe."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snooze.models import EngineState
from snooze.policy.probing import ProbeFacts, probe_due

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
