"""A restarted operator never sleeps an engine sooner than the one before it would have, even
though a busy model's activity times reach its status only once per status interval."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import httpx
from waits import wait_for

from snooze.api.times import format_time

from .conftest import FAST, MODELS, Cluster, OperatorThread

IDLE_AFTER = 10.0


def leave_status(cluster: Cluster, name: str, **times: float) -> None:
    """Set times on the status as an operator stopped at that moment would have left them."""
    status: dict[str, Any] = cluster.status(name)
    for key, value in times.items():
        status[key] = format_time(value)
    for pod in status["pods"]:
        pod["lastActivityTime"] = status["lastActivityTime"]
    response = cluster.http.patch(
        f"{MODELS.format(ns=cluster.ns)}/{name}/status",
        json={"status": status},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code == 200, response.text


def test_activity_the_status_had_not_caught_up_with_survives_a_restart(cluster: Cluster) -> None:
    settings = replace(FAST, status_interval=120.0)
    engine = cluster.create_pod("chat-0", labels={"app": "chat"})
    first = OperatorThread(settings).start()
    try:
        spec = {"selector": {"matchLabels": {"app": "chat"}}, "idle": {"after": "10s"}}
        cluster.create_model("chat", spec)
        wait_for("the status written", lambda: cluster.status("chat").get("activityWrittenTime"))
        wait_for("chat-0 awake", lambda: cluster.pod_state("chat-0") == "awake")
    finally:
        first.stop()
    # The status as a busy model's would read: activity written a second ago, when the last
    # activity it records was an hour old; a request comes after that write (and before the
    # next, due only 120 s later), and the operator stops before it writes again.
    now = time.time()
    leave_status(cluster, "chat", lastActivityTime=now - 3600, activityWrittenTime=now - 1)
    body = {"model": "m", "prompt": "hi", "max_tokens": 1}
    answer = httpx.post(f"http://{engine.address}/v1/completions", json=body, timeout=10)
    assert answer.status_code == 200
    served = time.time()

    second = OperatorThread(settings).start()
    try:
        # Not slept before idle.after has passed since the request, which no operator saw
        # (then it is: the restart delays the sleep by one idle.after at most).
        while time.time() < served + IDLE_AFTER - 0.5:
            assert engine.sleep_calls == 0, "slept on activity older than the request"
            time.sleep(0.05)
        wait_for("chat-0 asleep", lambda: cluster.pod_state("chat-0") == "asleep", timeout=30)
        assert engine.sleep_calls == 1
    finally:
        second.stop()
