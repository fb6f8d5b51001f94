"""Keep-awake windows and pre-wake end to end: the real operator wakes a sleeping model before
any request, at a window's start and ahead of the traffic its profile expects."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from waits import wait_for

from snooze.operator.embedded import OperatorThread
from snooze.policy import prewake

from .conftest import FAST, Cluster

LABELS = {"app": "chat"}
MODELS = "/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels"


def test_a_window_wakes_a_sleeping_model_before_any_request(
    cluster: Cluster, operator: OperatorThread
) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS)
    # A window every day, starting 8 seconds from now, for 3 (six cron fields: seconds first),
    # one engine awake.
    window = {"name": "burst", "cron": daily_from_now(8), "duration": "3s", "minAwake": 1}
    cluster.create_model(
        "chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "1s"}, "schedule": [window]}
    )
    wait_for("asleep between windows", lambda: engine.is_sleeping, timeout=30)
    woken_before = engine.wake_calls
    status = wait_for(
        "a window in force",
        lambda: (s := cluster.status("chat")).get("activeWindow") and s,
        timeout=30,
    )
    assert status["activeWindow"]["name"] == "burst" and status["activeWindow"]["minAwake"] == 1
    assert status["nextWindow"]["start"] > status["activeWindow"]["start"]
    wait_for(
        "woken by the window", lambda: engine.wake_calls > woken_before and not engine.is_sleeping
    )
    assert "snooze.dev/wake-requested-at" not in (
        cluster.model("chat")["metadata"].get("annotations") or {}
    )  # no request asked for it
    wait_for("a WindowStarted event", lambda: cluster.events("WindowStarted"))
    # After the window, the idle policy resumes: asleep again, and the end is told.
    wait_for("asleep after the window", lambda: engine.is_sleeping, timeout=30)
    wait_for("a WindowEnded event", lambda: cluster.events("WindowEnded"))
    started = cluster.events("WindowStarted")[0]["message"]
    assert "keep-awake window burst began: 1 engine(s) kept awake until" in started


def test_a_window_that_starts_every_few_seconds_is_refused_naming_the_field(
    cluster: Cluster, operator: OperatorThread
) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS)
    window = {"cron": "*/4 * * * * *", "duration": "4s", "minAwake": 10000}
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, "schedule": [window]})
    condition = wait_for(
        "SpecValid False",
        lambda: (c := cluster.condition("chat", "SpecValid")) and c["status"] == "False" and c,
    )
    assert condition["message"].startswith("spec.schedule.0.cron: '*/4 * * * * *' starts a")
    assert "at least 10m apart" in condition["message"]
    assert engine.wake_calls == 0 and engine.sleep_calls == 0  # nothing done on its account


def daily_from_now(seconds: float) -> str:
    """A six-field cron (seconds first, UTC) whose next start is `seconds` from now."""
    at = datetime.now(UTC) + timedelta(seconds=seconds)
    return f"{at.second} {at.minute} {at.hour} * * *"


@pytest.fixture
def later_operator(cluster: Cluster) -> Iterator[list[OperatorThread]]:
    threads: list[OperatorThread] = []
    yield threads
    for thread in threads:
        thread.stop()


def learnt_everywhere(cluster: Cluster, model: str) -> None:
    """What an earlier operator learnt, as it left it on the model's status: requests come
    after idleness in every slot of the week."""
    learnt = {"prewake": {"profile": "9" * prewake.SLOTS, "prewakes": 4, "hits": 3, "misses": 1}}
    response = cluster.http.patch(
        f"{MODELS}/{model}/status",
        json={"status": learnt},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code == 200, response.text


def test_a_prewake_fires_from_the_profile_kept_on_the_status(
    cluster: Cluster, later_operator: list[OperatorThread]
) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model(
        "chat",
        {
            "selector": {"matchLabels": LABELS},
            "idle": {"after": "1s"},
            "prewake": {"lead": "10m"},
        },
    )
    learnt_everywhere(cluster, "chat")  # the operator starts only now, and reads it
    thread = OperatorThread(FAST).start()
    later_operator.append(thread)

    wait_for("asleep", lambda: engine.sleep_calls > 0, timeout=30)
    # Ten minutes of lead: the next slot is always within reach, so the model is woken
    # once it sleeps, with no request (the gateway's annotation is never written). The
    # engine started awake, so its first wake is the pre-wake (counted from 0: the wake may
    # have begun before the test saw it asleep, and the engine counts a wake as it begins).
    wait_for("pre-woken", lambda: engine.wake_calls > 0, timeout=30)
    event = wait_for("a Prewake event", lambda: cluster.events("Prewake"))
    assert "woken ahead of the requests expected from" in event[0]["message"]
    status = wait_for(
        "the pre-wake on the status",
        lambda: (s := cluster.status("chat")).get("prewake", {}).get("prewakes") == 5 and s,
    )
    assert status["prewake"]["lastPrewakeTime"]
    assert status["prewake"]["profile"] == "9" * prewake.SLOTS  # kept across the restart
    assert "snooze.dev/wake-requested-at" not in (
        cluster.model("chat")["metadata"].get("annotations") or {}
    )
    prewakes = thread.metrics.prewakes.labels("default", "chat")._value.get()
    assert prewakes == 1
    # A request now (the gateway's wake annotation) makes it a hit.
    cluster.request_wake("chat")
    wait_for("a hit", lambda: cluster.status("chat")["prewake"]["hits"] == 4)
    assert thread.metrics.prewake_hits.labels("default", "chat")._value.get() == 1
