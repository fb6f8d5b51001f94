"""The sleep and wake policy: decision tables for each rule, and properties over random views."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from snooze.api.models import DesiredState, EngineState, InferenceModelSpec, Phase
from snooze.api.reasons import FailureReason
from snooze.policy.sleep import (
    Action,
    ActionKind,
    ActionReason,
    EngineView,
    ModelView,
    decide,
    may_try_sleep,
    next_idle_deadline,
    phase,
    retry_delay,
    wants_wake,
)

NOW = 1_800_000_000.0
IDLE = 600.0  # idle.after = "10m", the default in spec() below

AWAKE = EngineState.AWAKE
ASLEEP = EngineState.ASLEEP
DRAINING = EngineState.DRAINING
WAKING = EngineState.WAKING
FAILED = EngineState.FAILED


def spec(
    *,
    desired: str = "Auto",
    min_awake: int = 0,
    idle_after: str = "10m",
    on_request: bool = True,
    on_failure: str = "Report",
    threshold: int = 2,
) -> InferenceModelSpec:
    raw: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "llm"}},
        "idle": {"after": idle_after},
        "wake": {
            "onRequest": on_request,
            "onFailure": on_failure,
            "failureThreshold": threshold,
        },
        "minAwake": min_awake,
        "desiredState": desired,
    }
    return InferenceModelSpec.model_validate(raw)


def awake(pod: str, *, idle_for: float = 60.0, **kw: Any) -> EngineView:
    """A ready engine, awake and labelled so, last used `idle_for` seconds ago."""
    args: dict[str, Any] = {
        "pod": pod,
        "ready": True,
        "label": AWAKE,
        "sleeping": False,
        "busy": False,
        "last_activity": NOW - idle_for,
    }
    return EngineView(**(args | kw))


def asleep(pod: str, *, slept_ago: float = 3600.0, **kw: Any) -> EngineView:
    """A ready engine, asleep and labelled so, since `slept_ago` seconds."""
    args: dict[str, Any] = {
        "pod": pod,
        "ready": True,
        "label": ASLEEP,
        "sleeping": True,
        "busy": False,
        "last_activity": NOW - slept_ago - IDLE,
        "sleep_started": NOW - slept_ago,
    }
    return EngineView(**(args | kw))


def draining(pod: str, **kw: Any) -> EngineView:
    """An engine whose drain (the first step of a SLEEP action) is in flight.

    The operator does not probe an engine while an action runs on it, so `sleeping` is None.
    """
    args: dict[str, Any] = {"label": DRAINING, "action_running": True, "sleeping": None}
    return awake(pod, idle_for=IDLE + 5, **(args | kw))


# Not tests/builders.py's model: the policy's view of one, with its wake request's age.
def model(s: InferenceModelSpec | None = None, *, requested_ago: float | None = None) -> ModelView:
    return ModelView(
        spec=s or spec(),
        wake_requested=None if requested_ago is None else NOW - requested_ago,
        now=NOW,
    )


def summary(actions: Sequence[Action]) -> list[str]:
    """Actions as short sorted strings, `Sleep a` or `Label a=asleep`, for readable tables."""
    out = []
    for a in actions:
        if a.kind is ActionKind.LABEL:
            out.append(f"Label {a.pod}={a.label}")
        else:
            out.append(f"{a.kind} {a.pod}")
    return sorted(out)


def moves(actions: Sequence[Action]) -> list[Action]:
    return [a for a in actions if a.kind is not ActionKind.LABEL]


@dataclass(frozen=True)
class Case:
    id: str
    engines: list[EngineView]
    model: ModelView
    expected: list[str] = field(default_factory=list)


def table(*cases: Case) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in cases])


def check(case: Case) -> None:
    assert summary(decide(case.engines, case.model)) == sorted(case.expected)


# ---------------------------------------------------------------------------------------------
# Publishing the engine's truth


@table(
    Case("labels agree: nothing to do", [awake("a"), asleep("b")], model()),
    Case("new awake pod without label", [awake("a", label=None)], model(), ["Label a=awake"]),
    Case("new asleep pod without label", [asleep("a", label=None)], model(), ["Label a=asleep"]),
    Case("awake engine labelled asleep", [awake("a", label=ASLEEP)], model(), ["Label a=awake"]),
    Case("awake engine labelled failed", [awake("a", label=FAILED)], model(), ["Label a=awake"]),
    Case("asleep engine labelled awake", [asleep("a", label=AWAKE)], model(), ["Label a=asleep"]),
    Case("asleep engine keeps its failed label", [asleep("a", label=FAILED)], model()),
    Case(
        "cut-off wake: label asleep, and the request still wakes it",
        [asleep("a", label=WAKING, slept_ago=100)],
        model(requested_ago=50),
        ["Label a=asleep", "Wake a"],
    ),
    Case(
        "drain cut off before its /sleep was sent: resumed at once",
        [awake("a", label=DRAINING, idle_for=IDLE + 5, sleep_started=NOW - 100)],
        model(),
        ["Sleep a"],
    ),
    Case(
        "drain cut off with requests still in flight: resumed (the drain waits for them)",
        [awake("a", label=DRAINING, idle_for=IDLE + 5, busy=True, sleep_started=NOW - 100)],
        model(),
        ["Sleep a"],
    ),
    Case(
        "drain cut off, /sleep marked sent by an older drain: resumed",
        [awake("a", label=DRAINING, sleep_started=NOW - 10, sleep_sent=NOW - 500)],
        model(),
        ["Sleep a"],
    ),
    Case(
        "drain cut off after its /sleep was sent: left while the sleep may still run",
        [awake("a", label=DRAINING, sleep_started=NOW - 20, sleep_sent=NOW - 10)],
        ModelView(spec=spec(), wake_requested=None, now=NOW, sleep_grace=60),
    ),
    Case(
        "drain whose /sleep was marked sent but that the engine is not carrying out: resumed",
        [
            awake(
                "a",
                label=DRAINING,
                sleep_started=NOW - 20,
                sleep_sent=NOW - 10,
                sleep_running=False,
            )
        ],
        ModelView(spec=spec(), wake_requested=None, now=NOW, sleep_grace=60),
        ["Sleep a"],
    ),
    Case(
        "drain whose /sleep the engine is carrying out: left alone",
        [
            awake(
                "a", label=DRAINING, sleep_started=NOW - 20, sleep_sent=NOW - 10, sleep_running=True
            )
        ],
        ModelView(spec=spec(), wake_requested=None, now=NOW, sleep_grace=60),
    ),
    Case(
        "drain whose /sleep was sent longer ago than a sleep may take: awake again",
        [awake("a", label=DRAINING, sleep_started=NOW - 200, sleep_sent=NOW - 100)],
        ModelView(spec=spec(), wake_requested=None, now=NOW, sleep_grace=60),
        ["Label a=awake"],
    ),
    Case(
        "drain cut off, but a wake was requested since: awake again, not resumed",
        [awake("a", label=DRAINING, sleep_started=NOW - 100)],
        model(requested_ago=50),
        ["Label a=awake"],
    ),
    Case(
        "drain cut off, but minAwake needs it: awake again",
        [awake("a", label=DRAINING, idle_for=IDLE + 5, sleep_started=NOW - 100)],
        model(spec(min_awake=1)),
        ["Label a=awake"],
    ),
    Case(
        "drain cut off, minAwake met by another awake engine: resumed",
        [
            awake("a", label=DRAINING, idle_for=IDLE + 5, sleep_started=NOW - 100),
            awake("b", idle_for=0),
        ],
        model(spec(min_awake=1)),
        ["Sleep a"],
    ),
    Case(
        "drain that reached sleep: label asleep",
        [asleep("a", label=DRAINING)],
        model(),
        ["Label a=asleep"],
    ),
    Case(
        "corrected label counts for minAwake",
        [awake("a", label=ASLEEP, idle_for=IDLE + 5), asleep("b")],
        model(spec(min_awake=1)),
        ["Label a=awake"],
    ),
)
def test_labels(case: Case) -> None:
    check(case)


# ---------------------------------------------------------------------------------------------
# Engines that must be left alone


@table(
    Case(
        "not ready, asleep with a wake request",
        [asleep("a", ready=False, slept_ago=100)],
        model(requested_ago=10),
    ),
    Case("not ready, stale label", [awake("a", ready=False, label=ASLEEP)], model()),
    Case("not ready, idle", [awake("a", ready=False, idle_for=IDLE * 3)], model()),
    Case(
        "action running, asleep with a wake request",
        [asleep("a", action_running=True, slept_ago=100)],
        model(requested_ago=10),
    ),
    Case(
        "action running, idle",
        [awake("a", action_running=True, idle_for=IDLE * 3)],
        model(),
    ),
    Case(
        "action running, stale label is not a leftover",
        [asleep("a", label=WAKING, action_running=True)],
        model(),
    ),
    Case(
        "probe failed, asleep with a wake request",
        [asleep("a", sleeping=None, slept_ago=100)],
        model(requested_ago=10),
    ),
    Case("probe failed, idle", [awake("a", sleeping=None, idle_for=IDLE * 3)], model()),
    Case(
        "probe failed under desiredState Awake",
        [asleep("a", sleeping=None)],
        model(spec(desired="Awake")),
    ),
    Case(
        "not ready, drain in flight with a wake request",
        [draining("a", ready=False, sleep_started=NOW - 10)],
        model(requested_ago=5),
    ),
)
def test_untouchable_engines(case: Case) -> None:
    check(case)


# ---------------------------------------------------------------------------------------------
# Sleeping in Auto


@table(
    Case("idle exactly idle.after", [awake("a", idle_for=IDLE)], model(), ["Sleep a"]),
    Case("idle a second short", [awake("a", idle_for=IDLE - 1)], model()),
    Case("idle but busy", [awake("a", idle_for=IDLE * 10, busy=True)], model()),
    Case("idle after 30s", [awake("a", idle_for=31)], model(spec(idle_after="30s")), ["Sleep a"]),
    Case(
        "minAwake 1 keeps the most recently used",
        [awake("old", idle_for=IDLE * 3), awake("new", idle_for=IDLE * 2)],
        model(spec(min_awake=1)),
        ["Sleep old"],
    ),
    Case(
        "minAwake 1 of three: the two longest idle sleep",
        [awake("a", idle_for=IDLE * 2), awake("b", idle_for=IDLE * 4), awake("c", idle_for=IDLE)],
        model(spec(min_awake=1)),
        ["Sleep a", "Sleep b"],
    ),
    Case(
        "minAwake 2 of two: none sleeps",
        [awake("a", idle_for=IDLE * 3), awake("b", idle_for=IDLE * 2)],
        model(spec(min_awake=2)),
    ),
    Case(
        "minAwake 1, a busy engine does not count as idle but keeps the floor",
        [awake("busy", busy=True, idle_for=IDLE * 5), awake("b", idle_for=IDLE * 2)],
        model(spec(min_awake=1)),
        ["Sleep b"],
    ),
    Case(
        "minAwake 1 is met by a wake in flight",
        [awake("a", idle_for=IDLE * 2), asleep("b", label=WAKING, action_running=True)],
        model(spec(min_awake=1)),
        ["Sleep a"],
    ),
    # A SLEEP action starts by relabelling its engine draining; until that patch is seen, the
    # engine acts under an awake label. It may be on its way to sleep: it cannot hold the floor.
    Case(
        "minAwake 1 is not met by an engine acting under an awake label",
        [awake("a", action_running=True, sleeping=None), awake("b", idle_for=IDLE * 2)],
        model(spec(min_awake=1)),
    ),
    Case(
        "a wake requested within idle.after holds every sleep",
        [awake("a", idle_for=IDLE * 3)],
        model(requested_ago=IDLE - 1),
    ),
    Case(
        "a wake requested longer than idle.after ago does not",
        [awake("a", idle_for=IDLE * 3)],
        model(requested_ago=IDLE + 1),
        ["Sleep a"],
    ),
)
def test_sleep_auto(case: Case) -> None:
    check(case)


# ---------------------------------------------------------------------------------------------
# Waking in Auto


@table(
    Case(
        "request newer than the sleep",
        [asleep("a", slept_ago=100)],
        model(requested_ago=50),
        ["Wake a"],
    ),
    Case("request older than the sleep", [asleep("a", slept_ago=100)], model(requested_ago=150)),
    Case(
        "request when the sleep start is unknown",
        [asleep("a", sleep_started=None)],
        model(requested_ago=5000),
        ["Wake a"],
    ),
    Case("no request", [asleep("a")], model()),
    Case(
        "wake.onRequest false",
        [asleep("a", slept_ago=100)],
        model(spec(on_request=False), requested_ago=50),
    ),
    Case(
        "request wakes every engine that slept before it",
        [asleep("a", slept_ago=100), asleep("b", slept_ago=200), asleep("c", slept_ago=10)],
        model(requested_ago=50),
        ["Wake a", "Wake b"],
    ),
    Case(
        "request during a drain cancels the sleep",
        [draining("a", sleep_started=NOW - 10)],
        model(requested_ago=5),
        ["CancelSleep a"],
    ),
    Case(
        "request during a drain cancels it, even if the engine answered its last probe",
        [draining("a", sleep_started=NOW - 10, sleeping=False)],
        model(requested_ago=5),
        ["CancelSleep a"],
    ),
    Case(
        "request older than the drain does not cancel it",
        [draining("a", sleep_started=NOW - 10)],
        model(requested_ago=20),
    ),
    Case(
        "request during a drain, wake.onRequest false",
        [draining("a", sleep_started=NOW - 10)],
        model(spec(on_request=False), requested_ago=5),
    ),
    Case(
        "minAwake 1 wakes one asleep engine, the one with fewest failures",
        [
            asleep("a", wake_failures=1, last_failure=NOW - 3600),
            asleep("b"),
        ],
        model(spec(min_awake=1)),
        ["Wake b"],
    ),
    Case(
        "minAwake 2 with one awake wakes one more",
        [awake("a"), asleep("b"), asleep("c")],
        model(spec(min_awake=2)),
        ["Wake b"],
    ),
    Case(
        "minAwake 3 of two engines wakes what there is",
        [awake("a"), asleep("b")],
        model(spec(min_awake=3)),
        ["Wake b"],
    ),
    Case(
        "minAwake 1 met by a wake in flight",
        [asleep("a", label=WAKING, action_running=True), asleep("b")],
        model(spec(min_awake=1)),
    ),
    Case(
        "minAwake 1 met by a wake the request starts",
        [asleep("a", slept_ago=100), asleep("b", slept_ago=10)],
        model(spec(min_awake=1), requested_ago=50),
        ["Wake a"],
    ),
    Case(
        "minAwake skips an engine in backoff",
        [asleep("a", wake_failures=1, last_failure=NOW - 0.5)],
        model(spec(min_awake=1)),
    ),
)
def test_wake_auto(case: Case) -> None:
    check(case)


# ---------------------------------------------------------------------------------------------
# Manual overrides


@table(
    Case(
        "Asleep sleeps busy and recently used engines",
        [awake("a", busy=True, idle_for=0), awake("b", idle_for=1)],
        model(spec(desired="Asleep")),
        ["Sleep a", "Sleep b"],
    ),
    Case(
        "Asleep ignores minAwake",
        [awake("a"), awake("b")],
        model(spec(desired="Asleep", min_awake=2)),
        ["Sleep a", "Sleep b"],
    ),
    Case(
        "Asleep ignores a recent wake request",
        [awake("a"), asleep("b", slept_ago=100)],
        model(spec(desired="Asleep"), requested_ago=5),
        ["Sleep a"],
    ),
    Case(
        "Asleep does not cancel a drain",
        [draining("a", sleep_started=NOW - 10)],
        model(spec(desired="Asleep"), requested_ago=5),
    ),
    Case(
        "Asleep does not restart a failed engine",
        [asleep("a", wake_failures=5, last_failure=NOW - 1, last_failure_reason="Timeout")],
        model(spec(desired="Asleep", on_failure="Restart"), requested_ago=0),
    ),
    Case(
        "Awake wakes every asleep engine without a request",
        [asleep("a"), asleep("b"), awake("c", idle_for=IDLE * 5)],
        model(spec(desired="Awake")),
        ["Wake a", "Wake b"],
    ),
    Case(
        "Awake never sleeps an idle engine",
        [awake("a", idle_for=IDLE * 5)],
        model(spec(desired="Awake")),
    ),
    Case(
        "Awake cancels a drain",
        [draining("a")],
        model(spec(desired="Awake")),
        ["CancelSleep a"],
    ),
    Case(
        "Awake wakes regardless of wake.onRequest",
        [asleep("a")],
        model(spec(desired="Awake", on_request=False)),
        ["Wake a"],
    ),
)
def test_overrides(case: Case) -> None:
    check(case)


# ---------------------------------------------------------------------------------------------
# Failed wakes: backoff, threshold, remedy


def failed(
    pod: str, failures: int, *, ago: float, reason: str = "Timeout", **kw: Any
) -> EngineView:
    """An asleep engine whose last wake failed `ago` seconds ago, after a sleep long before."""
    return asleep(
        pod,
        slept_ago=3600,
        wake_failures=failures,
        last_failure=NOW - ago,
        last_failure_reason=reason,
        **kw,
    )


REQUEST = 1800.0  # a wake request newer than the sleep, older than the failures below


@table(
    Case("1 failure, within 1s backoff", [failed("a", 1, ago=0.5)], model(requested_ago=REQUEST)),
    Case(
        "1 failure, backoff over",
        [failed("a", 1, ago=1)],
        model(requested_ago=REQUEST),
        ["Wake a"],
    ),
    Case(
        "3 failures of 5, within 4s backoff",
        [failed("a", 3, ago=3.9)],
        model(spec(threshold=5), requested_ago=REQUEST),
    ),
    Case(
        "3 failures of 5, backoff over",
        [failed("a", 3, ago=4)],
        model(spec(threshold=5), requested_ago=REQUEST),
        ["Wake a"],
    ),
    Case(
        "threshold reached, Report",
        [failed("a", 2, ago=100)],
        model(requested_ago=REQUEST),
        ["MarkFailed a"],
    ),
    Case(
        "threshold reached, Restart",
        [failed("a", 2, ago=100)],
        model(spec(on_failure="Restart"), requested_ago=REQUEST),
        ["Restart a"],
    ),
    Case(
        "out of memory, Restart: a restart frees no one else's memory, so it is reported",
        [failed("a", 2, ago=100, reason=FailureReason.OUT_OF_MEMORY)],
        model(spec(on_failure="Restart"), requested_ago=REQUEST),
        ["MarkFailed a"],
    ),
    Case(
        "out of memory, reported, a newer request tries again",
        [failed("a", 2, ago=100, reason=FailureReason.OUT_OF_MEMORY, label=FAILED)],
        model(spec(on_failure="Restart"), requested_ago=50),
        ["Wake a"],
    ),
    Case(
        "hybrid crash at once, Report",
        [failed("a", 1, ago=100, reason=FailureReason.HYBRID_KV_CACHE_REINIT)],
        model(spec(threshold=5), requested_ago=REQUEST),
        ["MarkFailed a"],
    ),
    Case(
        "hybrid crash at once, Restart",
        [failed("a", 1, ago=0.1, reason=FailureReason.HYBRID_KV_CACHE_REINIT)],
        model(spec(threshold=5, on_failure="Restart"), requested_ago=REQUEST),
        ["Restart a"],
    ),
    Case(
        "reported already, no newer request",
        [failed("a", 2, ago=100, label=FAILED)],
        model(requested_ago=REQUEST),
    ),
    Case(
        "reported already, a newer request retries",
        [failed("a", 2, ago=100, label=FAILED)],
        model(requested_ago=50),
        ["Wake a"],
    ),
    Case(
        "reported hybrid crash, a newer request does not retry",
        [failed("a", 1, ago=100, reason=FailureReason.HYBRID_KV_CACHE_REINIT, label=FAILED)],
        model(requested_ago=50),
    ),
    Case(
        "reported already, minAwake does not retry",
        [failed("a", 2, ago=100, label=FAILED)],
        model(spec(min_awake=1)),
    ),
    Case(
        "Awake override, threshold reached, Restart",
        [failed("a", 2, ago=100)],
        model(spec(desired="Awake", on_failure="Restart")),
        ["Restart a"],
    ),
    # A wake started by minAwake fails like any other: the remedy must follow, or the engine
    # stays asleep for good and minAwake is never met.
    Case(
        "minAwake wake failed to the threshold, Restart",
        [failed("a", 2, ago=100)],
        model(spec(min_awake=1, on_failure="Restart")),
        ["Restart a"],
    ),
    Case(
        "minAwake wake failed to the threshold, Report",
        [failed("a", 2, ago=100)],
        model(spec(min_awake=1)),
        ["MarkFailed a"],
    ),
)
def test_failures(case: Case) -> None:
    check(case)


@pytest.mark.parametrize(
    ("failures", "seconds"),
    [(-1, 0), (0, 0), (1, 1), (2, 2), (3, 4), (6, 32), (7, 60), (100, 60)],
    ids=lambda v: str(v),
)
def test_retry_delay(failures: int, seconds: float) -> None:
    assert retry_delay(failures) == seconds


@pytest.mark.parametrize(
    ("requested_ago", "sleep_started_ago", "on_request", "expected"),
    [
        pytest.param(None, 100.0, True, False, id="no request"),
        pytest.param(50.0, 100.0, True, True, id="newer than sleep"),
        pytest.param(100.0, 100.0, True, True, id="same instant as sleep"),
        pytest.param(100.9, 100.0, True, True, id="in the same second, by hand"),
        pytest.param(101.5, 100.0, True, False, id="over a second before the sleep"),
        pytest.param(150.0, 100.0, True, False, id="older than sleep"),
        pytest.param(150.0, None, True, True, id="sleep start unknown"),
        pytest.param(50.0, 100.0, False, False, id="onRequest false"),
    ],
)
def test_wants_wake(
    requested_ago: float | None,
    sleep_started_ago: float | None,
    on_request: bool,
    expected: bool,
) -> None:
    started = None if sleep_started_ago is None else NOW - sleep_started_ago
    engine = asleep("a", sleep_started=started)
    assert wants_wake(engine, model(spec(on_request=on_request), requested_ago=requested_ago)) is (
        expected
    )


@pytest.mark.parametrize(
    ("engines", "view", "reasons"),
    [
        pytest.param([awake("a", idle_for=IDLE)], model(), {"a": "Idle"}, id="Idle"),
        pytest.param(
            [asleep("a", slept_ago=100), asleep("b", slept_ago=10)],
            model(spec(min_awake=2), requested_ago=50),
            {"a": "WakeRequested", "b": "MinAwake"},
            id="WakeRequested and MinAwake",
        ),
        pytest.param(
            [awake("a")], model(spec(desired="Asleep")), {"a": "DesiredAsleep"}, id="DesiredAsleep"
        ),
        pytest.param(
            [asleep("a")], model(spec(desired="Awake")), {"a": "DesiredAwake"}, id="DesiredAwake"
        ),
        pytest.param(
            [failed("a", 2, ago=100)], model(requested_ago=REQUEST), {"a": "Timeout"}, id="failure"
        ),
        pytest.param(
            [failed("a", 2, ago=100, reason="")],
            model(requested_ago=REQUEST),
            {"a": "WakeFailed"},
            id="failure without a reason",
        ),
    ],
)
def test_reasons_say_why(
    engines: list[EngineView], view: ModelView, reasons: dict[str, str]
) -> None:
    assert {a.pod: a.reason for a in moves(decide(engines, view))} == reasons


# ---------------------------------------------------------------------------------------------
# Phase


@pytest.mark.parametrize(
    ("labels", "ready", "spec_valid", "expected"),
    [
        pytest.param([AWAKE], 1, False, Phase.INVALID, id="invalid spec wins"),
        pytest.param([], 0, True, Phase.PENDING, id="no pods"),
        pytest.param([AWAKE], 0, True, Phase.PENDING, id="none ready"),
        pytest.param([None, None], 2, True, Phase.PENDING, id="unlabelled"),
        pytest.param([AWAKE, FAILED, WAKING], 3, True, Phase.DEGRADED, id="any failed"),
        pytest.param([AWAKE, WAKING, ASLEEP], 3, True, Phase.WAKING, id="any waking"),
        pytest.param([ASLEEP, AWAKE, DRAINING], 3, True, Phase.AWAKE, id="any awake"),
        pytest.param([ASLEEP, DRAINING], 2, True, Phase.DRAINING, id="draining"),
        pytest.param([ASLEEP, None], 1, True, Phase.ASLEEP, id="asleep"),
    ],
)
def test_phase(
    labels: list[EngineState | None], ready: int, spec_valid: bool, expected: Phase
) -> None:
    assert phase(labels, ready=ready, spec_valid=spec_valid) is expected


# ---------------------------------------------------------------------------------------------
# Properties over random views

PROPERTY = settings(max_examples=200, deadline=None)
REASONS = [
    "",
    FailureReason.TIMEOUT,
    FailureReason.UNREACHABLE,
    FailureReason.OUT_OF_MEMORY,
    FailureReason.HYBRID_KV_CACHE_REINIT,
]
# Most engines can take an action, so that the rules behind the guards get exercised too.
MOSTLY_TRUE = st.sampled_from([True, True, True, False])
MOSTLY_FALSE = st.sampled_from([False, False, True])
ago = st.integers(min_value=0, max_value=int(IDLE * 3)).map(float)


@st.composite
def engine_views(draw: st.DrawFn, pod: str, *, failures: bool = True) -> EngineView:
    wake_failures = draw(st.integers(0, 4)) if failures else 0
    return EngineView(
        pod=pod,
        ready=draw(MOSTLY_TRUE),
        label=draw(st.none() | st.sampled_from(list(EngineState))),
        sleeping=draw(st.sampled_from([True, False, None])),
        busy=draw(st.booleans()),
        last_activity=NOW - draw(ago),
        action_running=draw(MOSTLY_FALSE),
        sleep_started=draw(st.none() | ago.map(lambda s: NOW - s)),
        sleep_sent=draw(st.none() | ago.map(lambda s: NOW - s)),
        sleep_running=draw(st.sampled_from([None, True, False])),
        sleep_blocked=draw(MOSTLY_FALSE),
        sleep_failures=(sleep_failures := draw(st.integers(0, 3))),
        last_sleep_failure=draw(ago.map(lambda s: NOW - s)) if sleep_failures else None,
        wake_failures=wake_failures,
        last_failure=(draw(st.none() | ago.map(lambda s: NOW - s)) if wake_failures else None),
        last_failure_reason=draw(st.sampled_from(REASONS)) if wake_failures else "",
    )


@st.composite
def specs(draw: st.DrawFn, desired: DesiredState | None = None) -> InferenceModelSpec:
    return spec(
        desired=(desired or draw(st.sampled_from(list(DesiredState)))).value,
        min_awake=draw(st.integers(0, 4)),
        idle_after=draw(st.sampled_from(["30s", "10m"])),
        on_request=draw(st.booleans()),
        on_failure=draw(st.sampled_from(["Restart", "Report"])),
        threshold=draw(st.integers(1, 3)),
    )


@st.composite
def situations(
    draw: st.DrawFn, *, desired: DesiredState | None = None, failures: bool = True
) -> tuple[list[EngineView], ModelView]:
    count = draw(st.integers(0, 6))
    engines = [draw(engine_views(f"pod-{i}", failures=failures)) for i in range(count)]
    view = ModelView(
        spec=draw(specs(desired)),
        wake_requested=draw(st.none() | ago.map(lambda s: NOW - s)),
        now=NOW,
        sleep_grace=draw(st.sampled_from([0.0, 60.0])),
    )
    return engines, view


Situation = tuple[list[EngineView], ModelView]


def by_pod(engines: Sequence[EngineView]) -> dict[str, EngineView]:
    return {e.pod: e for e in engines}


@PROPERTY
@given(situations())
def test_decide_is_deterministic(situation: Situation) -> None:
    engines, view = situation
    assert decide(engines, view) == decide(list(engines), view)


@PROPERTY
@given(situations())
def test_no_action_on_engines_that_cannot_take_one(situation: Situation) -> None:
    engines, view = situation
    pods = by_pod(engines)
    for action in decide(engines, view):
        engine = pods[action.pod]
        assert engine.ready, action
        if engine.action_running:
            # The one action that stops an action in flight: a drain, for a wake request. An
            # engine is not probed while it acts, so its `sleeping` is None here.
            assert action.kind is ActionKind.CANCEL_SLEEP, action
            assert engine.label is DRAINING, action
        else:
            assert engine.sleeping is not None, action


@PROPERTY
@given(situations())
def test_at_most_one_move_and_one_label_per_pod(situation: Situation) -> None:
    engines, view = situation
    actions = decide(engines, view)
    assert max(Counter(a.pod for a in moves(actions)).values(), default=0) <= 1
    labels = [a.pod for a in actions if a.kind is ActionKind.LABEL]
    assert len(labels) == len(set(labels))
    slept = {a.pod for a in actions if a.kind is ActionKind.SLEEP}
    woken = {a.pod for a in actions if a.kind is ActionKind.WAKE}
    assert not slept & woken


@PROPERTY
@given(situations())
def test_labels_publish_the_engine_truth(situation: Situation) -> None:
    engines, view = situation
    pods = by_pod(engines)
    for action in decide(engines, view):
        if action.kind is not ActionKind.LABEL:
            continue
        engine = pods[action.pod]
        if engine.sleeping:
            assert engine.label not in (ASLEEP, FAILED)
            assert action.label is ASLEEP
        else:
            assert engine.label is not AWAKE
            assert action.label is AWAKE


@PROPERTY
@given(situations(desired=DesiredState.AUTO))
def test_auto_sleeps_only_idle_engines(situation: Situation) -> None:
    engines, view = situation
    pods = by_pod(engines)
    idle_after = view.spec.idle_after_seconds
    for action in decide(engines, view):
        if action.kind is not ActionKind.SLEEP or action.reason == "ResumeDrain":
            continue  # a resumed drain carries on a decision taken before (tested below)
        engine = pods[action.pod]
        assert not engine.busy
        assert view.now - engine.last_activity >= idle_after
        assert view.wake_requested is None or view.now - view.wake_requested >= idle_after


@PROPERTY
@given(situations())
def test_only_drains_cut_off_before_their_sleep_was_sent_are_resumed(situation: Situation) -> None:
    # Resuming one whose /sleep was sent could sleep an engine twice; one a request wants
    # awake must be published awake instead.
    engines, view = situation
    pods = by_pod(engines)
    for action in decide(engines, view):
        if action.reason != "ResumeDrain":
            continue
        engine = pods[action.pod]
        assert action.kind is ActionKind.SLEEP
        assert engine.label is DRAINING and engine.sleeping is False
        assert not engine.action_running
        started, sent = engine.sleep_started, engine.sleep_sent
        # Not sent for this drain, or sent but not being carried out by the engine.
        assert sent is None or started is None or sent < started or engine.sleep_running is False
        assert view.spec.desired_state is not DesiredState.AWAKE
        assert not wants_wake(engine, view)
        assert may_try_sleep(engine, view.now)  # blocked or backing off: not resumed either


@PROPERTY
@given(situations(desired=DesiredState.ASLEEP))
def test_desired_asleep_never_wakes(situation: Situation) -> None:
    engines, view = situation
    kinds = {a.kind for a in decide(engines, view)}
    assert not kinds & {ActionKind.WAKE, ActionKind.CANCEL_SLEEP, ActionKind.RESTART}


@PROPERTY
@given(situations(desired=DesiredState.AWAKE))
def test_desired_awake_never_sleeps(situation: Situation) -> None:
    engines, view = situation
    assert ActionKind.SLEEP not in {a.kind for a in decide(engines, view)}


@PROPERTY
@given(situations(desired=DesiredState.AWAKE, failures=False))
def test_desired_awake_wakes_every_sleeper(situation: Situation) -> None:
    engines, view = situation
    woken = {a.pod for a in decide(engines, view) if a.kind is ActionKind.WAKE}
    sleepers = {e.pod for e in engines if e.ready and not e.action_running and e.sleeping}
    assert woken == sleepers


@PROPERTY
@given(situations())
def test_wakes_respect_backoff_and_threshold(situation: Situation) -> None:
    engines, view = situation
    pods = by_pod(engines)
    wake = view.spec.wake
    for action in decide(engines, view):
        engine = pods[action.pod]
        if action.kind is not ActionKind.WAKE or engine.wake_failures == 0:
            continue
        assert engine.last_failure_reason != FailureReason.HYBRID_KV_CACHE_REINIT
        if engine.wake_failures >= wake.failure_threshold:
            # Only a reported engine, and only for a request newer than its failure.
            assert (
                wake.on_failure == "Report"
                or engine.last_failure_reason == FailureReason.OUT_OF_MEMORY
            )
            assert engine.label is FAILED
            assert view.wake_requested is not None and engine.last_failure is not None
            assert view.wake_requested > engine.last_failure
        elif engine.last_failure is not None:
            assert view.now >= engine.last_failure + retry_delay(engine.wake_failures)


@PROPERTY
@given(situations(desired=DesiredState.AUTO, failures=False))
def test_min_awake_is_honoured(situation: Situation) -> None:
    engines, view = situation
    actions = decide(engines, view)
    candidates = [e for e in engines if e.ready and not e.action_running and e.sleeping is not None]
    in_flight = [e for e in engines if e.action_running and e.label in (WAKING, AWAKE)]
    slept = {a.pod for a in actions if a.kind is ActionKind.SLEEP}
    woken = {a.pod for a in actions if a.kind in (ActionKind.WAKE, ActionKind.CANCEL_SLEEP)}
    awake_after = (
        sum(1 for e in candidates if e.sleeping is False and e.pod not in slept)
        + len(woken)
        + len(in_flight)
    )
    available = len(candidates) + len(in_flight)
    assert awake_after >= min(view.spec.min_awake, available)


@PROPERTY
@given(situations(desired=DesiredState.AUTO))
@example(
    (
        [awake("a", action_running=True, sleeping=None), awake("b", idle_for=IDLE * 2)],
        model(spec(min_awake=1)),
    )
)
def test_sleeps_take_only_the_surplus_over_min_awake(situation: Situation) -> None:
    # Only a wake in flight counts here: an engine acting under an awake label may be starting
    # its own drain, and sleeping another engine beside it could leave none awake.
    engines, view = situation
    actions = decide(engines, view)
    slept = {a.pod for a in actions if a.kind is ActionKind.SLEEP}
    if not slept:
        return
    candidates = [e for e in engines if e.ready and not e.action_running and e.sleeping is not None]
    staying = sum(1 for e in candidates if e.sleeping is False and e.pod not in slept)
    waking = sum(1 for e in engines if e.action_running and e.label is WAKING)
    woken = sum(1 for a in actions if a.kind in (ActionKind.WAKE, ActionKind.CANCEL_SLEEP))
    assert staying + waking + woken >= view.spec.min_awake


# ---------------------------------------------------------------------------------------------
# GPU pool members: they wake only with the pool's grant and sleep when it makes room


def pooled(engine: EngineView, **kw: Any) -> EngineView:
    return replace(engine, pooled=True, **kw)


@table(
    Case(
        "a member asks for room instead of waking",
        [pooled(asleep("a", slept_ago=100))],
        model(requested_ago=50),
        ["AskRoom a"],
    ),
    Case(
        "a member granted room wakes",
        [pooled(asleep("a", slept_ago=100), pool_grant=True)],
        model(requested_ago=50),
        ["Wake a"],
    ),
    Case(
        "minAwake asks the pool too",
        [pooled(asleep("a"))],
        model(spec(min_awake=1)),
        ["AskRoom a"],
    ),
    Case(
        "the pool puts an awake member to sleep, idle or not",
        [pooled(awake("a", idle_for=0), pool_evict=True)],
        model(),
        ["Sleep a"],
    ),
    Case(
        "a drain the pool ordered is not cancelled by a request",
        [pooled(draining("a", sleep_started=NOW - 10), pool_evict=True)],
        model(requested_ago=5),
    ),
    Case(
        "a drain under way that the pool promised to a wake is not cancelled by a request",
        [pooled(draining("a", sleep_started=NOW - 10), pool_promised=True)],
        model(requested_ago=5),
    ),
    Case(
        "a drain the pool ordered only for headroom is cancelled by a request",
        [pooled(draining("a", sleep_started=NOW - 10), pool_evict=True, pool_headroom=True)],
        model(requested_ago=5),
        ["CancelSleep a"],
    ),
    Case(
        "desiredState Awake keeps a member awake whatever the pool says",
        [pooled(awake("a"), pool_evict=True)],
        model(spec(desired="Awake")),
    ),
    Case(
        "a member that is not asked for stays asleep, granted or not",
        [pooled(asleep("a"), pool_grant=True)],
        model(),
    ),
    Case(
        "a member the pool primed is woken back into its room",
        [pooled(asleep("a"), pool_grant=True, pool_rewake=True)],
        model(),
        ["Wake a"],
    ),
    Case(
        "a primed member is not woken back without room (it sleeps on)",
        [pooled(asleep("a"), pool_rewake=True)],
        model(),
    ),
    Case(
        "desiredState Asleep keeps a primed member asleep",
        [pooled(asleep("a"), pool_grant=True, pool_rewake=True)],
        model(spec(desired="Asleep")),
    ),
)
def test_pool_members(case: Case) -> None:
    check(case)


@PROPERTY
@given(situations(), st.booleans(), st.booleans(), st.booleans())
def test_a_pool_member_never_wakes_without_a_grant(
    situation: Situation, grant: bool, evict: bool, headroom: bool
) -> None:
    engines, view = situation
    members = [
        replace(e, pooled=True, pool_grant=grant, pool_evict=evict, pool_headroom=headroom)
        for e in engines
    ]
    for action in decide(members, view):
        if action.kind is ActionKind.WAKE:
            assert grant
        if action.kind is ActionKind.CANCEL_SLEEP:
            assert not evict or headroom


@pytest.mark.parametrize(
    ("engine", "desired", "expected"),
    [
        # Without sleep mode: never tried again for this pod and spec, idle or told to sleep.
        (awake("a", idle_for=2 * IDLE, sleep_blocked=True), "Auto", []),
        (awake("a", sleep_blocked=True), "Asleep", []),
        # A failed sleep backs off as a failed wake does: 1 s, 2 s, 4 s...
        (awake("a", idle_for=2 * IDLE, sleep_failures=3, last_sleep_failure=NOW - 3), "Auto", []),
        (
            awake("a", idle_for=2 * IDLE, sleep_failures=3, last_sleep_failure=NOW - 5),
            "Auto",
            ["Sleep a"],
        ),
        (awake("a", sleep_failures=1, last_sleep_failure=NOW - 0.5), "Asleep", []),
        (awake("a", sleep_failures=1, last_sleep_failure=NOW - 1), "Asleep", ["Sleep a"]),
    ],
)
def test_a_failed_sleep_is_not_retried_at_every_probe(
    engine: EngineView, desired: str, expected: list[str]
) -> None:
    assert summary(decide([engine], model(spec(desired=desired)))) == expected


# ---------------------------------------------------------------------------------------------
# When time alone makes an idle engine sleep (the loop cycles then, not an interval later)


@table(
    Case("one idle engine: when its idle.after ends", [awake("a", idle_for=60)], model()),
    Case("the earliest of two", [awake("a", idle_for=60), awake("b", idle_for=500)], model()),
    Case("a deadline gone by is not one", [awake("a", idle_for=IDLE + 1)], model()),
    Case("a busy engine has none", [awake("a", idle_for=60, busy=True)], model()),
    Case("nor one that acts", [awake("a", idle_for=60, action_running=True)], model()),
    Case("nor one asleep", [asleep("a")], model()),
    Case("nor one not ready", [awake("a", idle_for=60, ready=False)], model()),
    Case("nor one that cannot sleep", [awake("a", idle_for=60, sleep_blocked=True)], model()),
    Case("desiredState Awake: none", [awake("a", idle_for=60)], model(spec(desired="Awake"))),
    Case("idle.after Never: none", [awake("a", idle_for=60)], model(spec(idle_after="Never"))),
    Case("a wake request's quiet period", [awake("a", idle_for=595)], model(requested_ago=10)),
    Case(
        "a failed sleep's backoff",
        [awake("a", idle_for=IDLE + 1, sleep_failures=3, last_sleep_failure=NOW - 1)],
        model(),
    ),
    Case(
        "a drain left over with its sleep sent: when its grace ends",
        [
            awake(
                "a", idle_for=IDLE + 1, label=DRAINING, sleep_started=NOW - 10, sleep_sent=NOW - 10
            )
        ],
        replace(model(), sleep_grace=60.0),
    ),
)
def test_next_idle_deadline(case: Case) -> None:
    expected = {
        "one idle engine: when its idle.after ends": NOW + IDLE - 60,
        "the earliest of two": NOW + IDLE - 500,
        "a deadline gone by is not one": None,
        "a busy engine has none": None,
        "nor one that acts": None,
        "nor one asleep": None,
        "nor one not ready": None,
        "nor one that cannot sleep": None,
        "desiredState Awake: none": None,
        "idle.after Never: none": None,
        "a wake request's quiet period": math.nextafter(NOW - 10 + IDLE, math.inf),
        "a failed sleep's backoff": NOW - 1 + retry_delay(3),
        "a drain left over with its sleep sent: when its grace ends": NOW - 10 + 60.0,
    }[case.id]
    assert next_idle_deadline(case.engines, case.model) == expected


def idle_sleeps(engines: Sequence[EngineView], view: ModelView) -> list[str]:
    return sorted(a.pod for a in decide(engines, view) if a.reason == ActionReason.IDLE)


@PROPERTY
@given(situations(), st.floats(min_value=0.001, max_value=0.999))
def test_no_idle_sleep_comes_due_before_the_next_idle_deadline(
    situation: Situation, fraction: float
) -> None:
    """Between now and the deadline the idle sleeps are those of now: a loop that waits until
    the deadline (or its regular interval, if sooner) misses none."""
    engines, view = situation
    deadline = next_idle_deadline(engines, view)
    later = NOW + fraction * ((deadline if deadline is not None else NOW + 3 * IDLE) - NOW)
    assume(deadline is None or later < deadline)  # a deadline microseconds away rounds to it
    assert idle_sleeps(engines, replace(view, now=later)) == idle_sleeps(engines, view)


@st.composite
def idle_ones(draw: st.DrawFn) -> Situation:
    """Awake engines idle for part of idle.after, some of them backing off from a failed
    sleep, some busy; desiredState Auto, no minAwake: each deadline is a sleep."""
    engines = []
    for i in range(draw(st.integers(1, 4))):
        failures = draw(st.integers(0, 3))
        engines.append(
            awake(
                f"pod-{i}",
                idle_for=draw(st.floats(0, 2 * IDLE)),
                busy=draw(MOSTLY_FALSE),
                sleep_failures=failures,
                last_sleep_failure=NOW - draw(st.floats(0, 120)) if failures else None,
            )
        )
    requested = draw(st.none() | st.floats(0, 2 * IDLE))
    return engines, model(spec(), requested_ago=requested)


@PROPERTY
@given(idle_ones(), st.floats(min_value=0.001, max_value=0.999))
def test_the_next_idle_deadline_is_the_first_idle_sleep_time_brings(
    situation: Situation, fraction: float
) -> None:
    engines, view = situation
    deadline = next_idle_deadline(engines, view)
    now = idle_sleeps(engines, view)
    if deadline is None:
        assert idle_sleeps(engines, replace(view, now=NOW + 10 * IDLE)) == now
        return
    before = NOW + fraction * (deadline - NOW)
    assume(before < deadline)  # a deadline microseconds away rounds to it
    assert idle_sleeps(engines, replace(view, now=before)) == now
    assert len(idle_sleeps(engines, replace(view, now=deadline))) > len(now)
