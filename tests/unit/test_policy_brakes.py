"""Brakes on the model loop: an engine's claims believed at a braked pace when it contradicts
itself (policy/brakes.py), a wake request answered once (policy/sleep.py), tables for each
rule, and the model loop driven by engines whose answers are arbitrary sequences."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snooze.api.models import EngineState, InferenceModelSpec
from snooze.policy import probing
from snooze.policy.brakes import Brake, Claim, Pace, acted, hear, telling
from snooze.policy.runs import Process
from snooze.policy.sleep import (
    ActionKind,
    EngineView,
    ModelView,
    answered_request,
    decide,
    next_idle_deadline,
    wants_wake,
)

PACE = Pace.of(10.0)  # holds from 10 s to 300 s, forgiven after 600 s
RUN = Process("uid-1", 0)
METRICS = "/metrics (vllm:engine_sleep_state)"
NOW = 1_800_000_000.0


def claim(sleeping: bool, at: float, source: str = METRICS) -> Claim:
    return Claim(sleeping=sleeping, at=at, source=source)


def heard_in_turn(
    claims: list[tuple[float, bool]], *, prompted_at: tuple[float, ...] = ()
) -> list[bool]:
    """What is believed after each claim, heard in order."""
    brake, believed = Brake(), []
    for at, sleeping in claims:
        heard = hear(brake, claim(sleeping, at), process=RUN, prompted=at in prompted_at, pace=PACE)
        brake = heard.brake
        believed.append(heard.sleeping)
    return believed


@pytest.mark.parametrize(
    ("claims", "believed"),
    [
        pytest.param([(0, True), (10, True), (20, True)], [True] * 3, id="steady"),
        pytest.param([(0, False), (10, True)], [False, True], id="one change, believed at once"),
        pytest.param(
            [(0, False), (10, True), (15, False), (20, False)],
            [False, True, True, False],
            id="the second waits out the first hold (10 s)",
        ),
        pytest.param(
            [(0, False), (10, True), (20, False), (30, True), (40, True), (50, True), (60, False)],
            [False, True, False, False, True, True, True],
            id="the holds double: 10 s, then 20 s, then 40 s",
        ),
    ],
)
def test_a_contradiction_is_believed_once_per_hold(
    claims: list[tuple[float, bool]], believed: list[bool]
) -> None:
    assert heard_in_turn(claims) == believed


def test_a_change_that_snooze_made_is_no_contradiction() -> None:
    brake = hear(Brake(), claim(True, 0), process=RUN, prompted=False, pace=PACE).brake
    # Its wake's own check, then probes that agree: no strike.
    brake = acted(brake, claim(False, 1, "/is_sleeping after its /wake_up"), process=RUN)
    heard = hear(brake, claim(False, 11), process=RUN, prompted=False, pace=PACE)
    assert heard.brake.strikes == 0 and heard.sleeping is False
    # A probe that follows a sleep that gave no answer is believed too.
    heard = hear(heard.brake, claim(True, 21), process=RUN, prompted=True, pace=PACE)
    assert heard.brake.strikes == 0 and heard.sleeping is True


def test_a_new_run_of_the_engine_starts_afresh() -> None:
    brake = Brake()
    for at, sleeping in ((0, False), (10, True), (20, False)):
        brake = hear(brake, claim(sleeping, at), process=RUN, prompted=False, pace=PACE).brake
    assert brake.strikes == 2 and brake.holding(25)
    restarted = hear(brake, claim(True, 25), process=Process("uid-1", 1), prompted=False, pace=PACE)
    assert restarted.sleeping is True and restarted.brake.strikes == 0


def test_an_engine_quiet_for_long_enough_is_forgiven() -> None:
    brake = Brake()
    for at, sleeping in ((0, False), (10, True), (20, False)):
        brake = hear(brake, claim(sleeping, at), process=RUN, prompted=False, pace=PACE).brake
    assert brake.strikes == 2 and brake.told
    later = hear(brake, claim(True, 20 + PACE.forgive), process=RUN, prompted=False, pace=PACE)
    assert later.brake.strikes == 1 and later.contradiction is None
    assert later.brake.held_until == 20 + PACE.forgive + PACE.base


def test_the_event_is_told_once_with_both_claims() -> None:
    brake, told = Brake(), []
    for at in range(0, 600, 10):
        heard = hear(brake, claim(at % 20 == 0, float(at)), process=RUN, prompted=False, pace=PACE)
        brake = heard.brake
        if heard.contradiction is not None:
            told.append((at, telling(heard.contradiction, pace=PACE, brake=brake, now=at)))
    assert len(told) == 1
    at, message = told[0]
    assert at == 20  # the second contradiction; one alone may be a person's hand
    assert f"asleep ({METRICS})" in message and f"awake ({METRICS})" in message
    assert "20s" in message and "5m" not in message and "300s" in message


def view(**kw: Any) -> EngineView:
    args: dict[str, Any] = {
        "pod": "a",
        "ready": True,
        "label": EngineState.ASLEEP,
        "sleeping": True,
        "busy": False,
        "last_activity": NOW - 3600,
    }
    return EngineView(**(args | kw))


def spec(**extra: Any) -> InferenceModelSpec:
    raw = {"selector": {"matchLabels": {"app": "llm"}}, "idle": {"after": "10m"}, **extra}
    return InferenceModelSpec.model_validate(raw)


@pytest.mark.parametrize(
    ("requested_ago", "sleep_started_ago", "woke_ago", "wanted", "answered"),
    [
        pytest.param(50, None, None, True, False, id="never woken: wanted"),
        pytest.param(50, None, 40, False, True, id="answered by a wake since, asleep again"),
        pytest.param(50, None, 60, True, False, id="woken before it: wanted"),
        pytest.param(50, 30, 40, False, False, id="slept since: an old request, left alone"),
        pytest.param(50, 60, 55, True, False, id="slept and woken before it: wanted"),
        pytest.param(50, 70, 50, False, True, id="the same instant as its wake: answered"),
    ],
)
def test_a_wake_answers_the_requests_made_before_it(
    requested_ago: float,
    sleep_started_ago: float | None,
    woke_ago: float | None,
    wanted: bool,
    answered: bool,
) -> None:
    engine = view(
        sleep_started=None if sleep_started_ago is None else NOW - sleep_started_ago,
        woke_at=None if woke_ago is None else NOW - woke_ago,
    )
    model = ModelView(spec=spec(), wake_requested=NOW - requested_ago, now=NOW)
    assert wants_wake(engine, model) is wanted
    assert answered_request([engine], model) is answered
    # An engine published awake needs no wake, and keeps no request alive.
    assert not answered_request([replace(engine, label=EngineState.AWAKE)], model)


# ---------------------------------------------------------------------------------------------
# The model loop, driven by engines whose answers are arbitrary sequences

INTERVAL = 10.0
ACTION_SECONDS = 0.04  # a step and the poke after it: the loop's next cycle comes this soon
MINUTES = 30
STARTUP_SECONDS = 300.0
"""How long a restarted engine takes to load and answer again (a few minutes for vLLM)."""
REQUESTS_APART = 300.0
"""Wake requests come at most this often: each is a new one that the engines must answer."""
WRITES_PER_POD_PER_MINUTE = 40
"""The bound in any one minute: a wake and its retries, a sleep, the holds' first doublings
and the Event, all in the same minute."""
MEAN_WRITES_PER_POD_PER_MINUTE = 8
"""The bound over the whole run. An engine that never sleeps when told costs a try a minute
(the sleep's backoff caps at 60 s, five writes each); one whose claims flip at every probe
cost two writes a probe interval before the brake (twelve a minute, for as long as it runs)."""


@dataclass
class Pod:
    """One engine as the loop knows it, and what its answers will be."""

    name: str
    answers: Iterator[bool]
    label: EngineState | None = None
    brake: Brake = field(default_factory=Brake)
    sleeping: bool | None = None
    prompted: bool = False
    last_probe: float | None = None
    last_activity: float = 0.0
    sleep_started: float | None = None
    woke_at: float | None = None
    wake_failures: int = 0
    last_failure: float | None = None
    sleep_failures: int = 0
    last_sleep_failure: float | None = None
    shown: EngineState | None = None
    """What the status says of it."""
    ready_at: float = -math.inf
    """Restarted: its new engine answers from then on."""
    writes: list[float] = field(default_factory=list)

    def view(self, now: float) -> EngineView:
        return EngineView(
            pod=self.name,
            ready=now >= self.ready_at,
            label=self.label,
            sleeping=self.sleeping,
            busy=False,
            last_activity=self.last_activity,
            sleep_started=self.sleep_started,
            woke_at=self.woke_at,
            wake_failures=self.wake_failures,
            last_failure=self.last_failure,
            sleep_failures=self.sleep_failures,
            last_sleep_failure=self.last_sleep_failure,
        )

    def believe(self, now: float) -> bool:
        """The answer of its own check after a step: believed."""
        sleeping = next(self.answers)
        self.brake = acted(self.brake, claim(sleeping, now, "/is_sleeping"), process=RUN)
        self.sleeping, self.prompted = sleeping, False
        return sleeping

    def publish(self, label: EngineState, now: float, writes: int = 1) -> None:
        if label is EngineState.AWAKE and self.label is not EngineState.AWAKE:
            self.woke_at, self.last_activity = now, now
        self.label = label
        self.writes.extend([now] * writes)


class Loop:
    """One model's loop as the operator runs it (operator/model/loop.py), with actions that end at
    once: probes when policy/probing.py says, claims heard through the brake, the policy's
    actions (one per pod and cycle, as the executor starts them), each write counted."""

    def __init__(self, pods: list[Pod], model: InferenceModelSpec, requests: list[float]):
        self.pods, self.spec, self.requests = pods, model, requests
        self.requested: float | None = None
        self.cleared: float | None = None

    def cycle(self, now: float) -> bool:
        """One cycle; whether it acted (the executor then pokes the loop)."""
        arrived = [r for r in self.requests if r <= now]
        if arrived and arrived[-1] != self.cleared:
            self.requested = arrived[-1]
        for pod in self.pods:
            if pod.ready_at <= now and probing.probe_due(
                probing.ProbeFacts(
                    last_probe=pod.last_probe,
                    answered=pod.last_probe is not None,
                    sleeping=pod.sleeping,
                    label=pod.label,
                    direct_activity=False,
                    last_activity=pod.last_activity,
                ),
                idle_after=self.spec.idle_after_seconds,
                now=now,
                interval=INTERVAL,
                drift=60.0,
            ):
                said = claim(next(pod.answers), now)
                heard = hear(pod.brake, said, process=RUN, prompted=pod.prompted, pace=PACE)
                pod.brake, pod.sleeping, pod.prompted = heard.brake, heard.sleeping, False
                pod.last_probe = now
                if heard.contradiction is not None:
                    pod.writes.append(now)  # the Event
        model = ModelView(spec=self.spec, wake_requested=self.requested, now=now)
        views = [p.view(now) for p in self.pods]
        if self.requested is not None and answered_request(views, model):
            self.cleared, self.requested = self.requested, None
            self.pods[0].writes.append(now)  # the annotation's removal
        acted = False
        started: set[str] = set()
        by_name = {p.name: p for p in self.pods}
        for action in decide(views, model):
            pod = by_name[action.pod]
            if pod.name in started or action.kind is ActionKind.CANCEL_SLEEP:
                continue  # the executor starts one step per engine at a time
            started.add(pod.name)
            acted = True
            self.act(pod, action.kind, action.label, now)
        for pod in self.pods:
            shown = (
                EngineState.ASLEEP if pod.label is EngineState.AWAKE and pod.sleeping else pod.label
            )
            if shown is not pod.shown:
                pod.shown = shown
                pod.writes.append(now)  # its part of the status
        return acted

    def act(self, pod: Pod, kind: ActionKind, label: EngineState | None, now: float) -> None:
        if kind is ActionKind.LABEL and label is not None:
            pod.publish(label, now)
        elif kind in (ActionKind.WAKE, ActionKind.SLEEP):
            sleep = kind is ActionKind.SLEEP
            # The label and the Event (and a sleep's sent mark); then the engine's own answer.
            pod.publish(
                EngineState.DRAINING if sleep else EngineState.WAKING, now, 3 if sleep else 2
            )
            if sleep:
                pod.sleep_started = now
            done = pod.believe(now) is sleep
            failures = 0 if done else (pod.sleep_failures if sleep else pod.wake_failures) + 1
            if sleep:
                pod.sleep_failures, pod.last_sleep_failure = failures, None if done else now
            else:
                pod.wake_failures, pod.last_failure = failures, None if done else now
            asleep = sleep is done  # a sleep done, or a wake failed
            pod.publish(EngineState.ASLEEP if asleep else EngineState.AWAKE, now, writes=2)
        elif kind is ActionKind.MARK_FAILED:
            pod.publish(EngineState.FAILED, now, writes=2)
        elif kind is ActionKind.RESTART:
            # Deleted (a write and its Event); its controller makes a new pod under the same
            # name, whose engine answers once loaded: a new engine, with a new run.
            fresh = Pod(name=pod.name, answers=pod.answers, ready_at=now + STARTUP_SECONDS)
            fresh.writes = [*pod.writes, now, now]
            self.pods[self.pods.index(pod)] = fresh

    def worst(self, start: float) -> tuple[str, int]:
        """The pod with the most writes in any minute since `start`, and how many."""
        found = ("", 0)
        for pod in self.pods:
            per_minute: dict[int, int] = defaultdict(int)
            for at in pod.writes:
                per_minute[math.floor((at - start) / 60)] += 1
            most = max(per_minute.values(), default=0)
            if most > found[1]:
                found = (pod.name, most)
        return found

    def run(self, start: float, minutes: int) -> None:
        """Cycle for `minutes`, or until a pod writes more than the bound in a minute."""
        now = start
        while now < start + minutes * 60 and self.worst(start)[1] <= WRITES_PER_POD_PER_MINUTE:
            if self.cycle(now):
                now += ACTION_SECONDS
                continue
            model = ModelView(spec=self.spec, wake_requested=self.requested, now=now)
            deadline = next_idle_deadline([p.view(now) for p in self.pods], model)
            step = INTERVAL if deadline is None else min(INTERVAL, deadline - now + 0.05)
            upcoming = [r - now for r in self.requests if r > now]
            now += max(min([step, *upcoming]), 0.01)


def cycled(answers: list[bool]) -> Iterator[bool]:
    while True:
        yield from answers


@settings(max_examples=60, deadline=None)
@given(
    answers=st.lists(st.lists(st.booleans(), min_size=1, max_size=12), min_size=1, max_size=3),
    requests=st.lists(st.floats(min_value=-120, max_value=MINUTES * 60), max_size=MINUTES),
    idle_after=st.sampled_from(["30s", "1m", "10m"]),
    min_awake=st.integers(0, 1),
    on_failure=st.sampled_from(["Report", "Restart"]),
)
def test_writes_per_pod_per_minute_stay_bounded_whatever_the_engines_answer(
    answers: list[list[bool]],
    requests: list[float],
    idle_after: str,
    min_awake: int,
    on_failure: str,
) -> None:
    # Wake requests now and then (the first may come before the engines start: a stale one).
    spaced: list[float] = []
    for at in sorted(requests):
        if not spaced or at - spaced[-1] >= REQUESTS_APART:
            spaced.append(at)
    pods = [Pod(name=f"p{i}", answers=cycled(a)) for i, a in enumerate(answers)]
    model = spec(idle={"after": idle_after}, minAwake=min_awake, wake={"onFailure": on_failure})
    loop = Loop(pods, model, [NOW + r for r in spaced])
    loop.run(NOW, MINUTES)
    pod, writes = loop.worst(NOW)
    assert writes <= WRITES_PER_POD_PER_MINUTE, (pod, writes)
    for each in loop.pods:
        assert len(each.writes) <= MEAN_WRITES_PER_POD_PER_MINUTE * MINUTES, (
            each.name,
            each.writes,
        )
