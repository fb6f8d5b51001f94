"""An engine's idle clock runs only while requests can reach it: an engine that was
unreachable for longer than idle.after is not put to sleep the moment it answers again (it
could get no requests meanwhile), and one that was idle before it stopped answering keeps
that idle time (probes that time out under load do not restart every clock they touch)."""

from __future__ import annotations

import time
from dataclasses import replace

from waits import wait_for

from snooze.operator.embedded import OperatorThread
from snooze.sandbox import Sandbox
from snooze.sim import SimulatedEngine

from .conftest import FAST, Cluster, _addresses

LABELS = {"app": "chat"}
IDLE = 4.0  # seconds


def awake_engine(cluster: Cluster) -> SimulatedEngine:
    """One engine of a model with a short idle.after, labelled awake."""
    engine = cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model(
        "chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": f"{IDLE:g}s"}}
    )
    wait_for("labelled awake", lambda: cluster.pod_state("chat-0") == "awake")
    return engine


def test_an_engine_back_from_unreachable_gets_the_rest_of_its_idle_after(
    cluster: Cluster, operator: OperatorThread
) -> None:
    born = time.monotonic()
    engine = awake_engine(cluster)
    # Its pod's address stops answering (nothing listens there) for twice idle.after.
    cluster.set_pod_ready("chat-0", next(_addresses), ready=True)
    wait_for(
        "reported unreachable",
        lambda: any(
            p.get("state") == "unreachable" for p in cluster.status("chat").get("pods") or []
        ),
    )
    # The idle time it had until a probe found it unreachable is kept (as the next test
    # shows): at most its whole life so far.
    kept = time.monotonic() - born
    # A sleep: proves it is not slept for twice idle.after, the kept idle time being less.
    time.sleep(2 * IDLE)
    assert engine.sleep_calls == 0
    # Timed from before its address is back: the operator cannot see it answer any sooner.
    # (Not from the EngineReachable Event, which kopf posts in the background, at times more
    # than a second later.)
    back = time.monotonic()
    cluster.set_pod_ready("chat-0", engine.address.split(":")[0], ready=True)
    wait_for("reachable again", lambda: cluster.events("EngineReachable"))
    left = IDLE - kept  # its clock went on from there when it answered again
    assert left > 1.0, "the set-up took too long to show anything"
    time.sleep(max(0.0, back + left / 2 - time.monotonic()))
    assert engine.sleep_calls == 0, "slept as soon as it was back"
    assert not engine.is_sleeping
    # Still idle: it sleeps, no sooner than the rest of its idle.after after it came back.
    wait_for("asleep", lambda: engine.is_sleeping, timeout=30)
    assert time.monotonic() - back >= left - 0.1


def test_idle_time_before_the_engine_stopped_answering_still_counts(
    cluster: Cluster, operator: OperatorThread
) -> None:
    engine = awake_engine(cluster)
    time.sleep(IDLE - 1.5)  # idle all along, most of idle.after gone
    cluster.set_pod_ready("chat-0", next(_addresses), ready=True)
    wait_for("reported unreachable", lambda: cluster.events("EngineUnreachable"))
    time.sleep(IDLE / 2)  # longer than the idle time it has left
    cluster.set_pod_ready("chat-0", engine.address.split(":")[0], ready=True)
    back = wait_for(
        "reachable again", lambda: cluster.events("EngineReachable") and time.monotonic()
    )
    # About 1.5 s of idle.after was left when it stopped answering: it sleeps well before a
    # whole idle.after has passed since it came back.
    wait_for("asleep", lambda: engine.is_sleeping, timeout=30)
    assert time.monotonic() - back < IDLE - 0.5


def test_an_idle_engine_sleeps_when_idle_after_ends_not_at_the_next_cycle(
    cluster: Cluster, sandbox: Sandbox
) -> None:
    """With a probe interval three times idle.after, the sleep still comes at idle.after: the
    loop's next cycle is at the engine's idle deadline, not a whole interval later."""
    operator = OperatorThread(replace(FAST, probe_interval=6.0, drift_interval=30.0)).start()
    try:
        engine = cluster.create_pod("chat-0", labels=LABELS)
        cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "2s"}})
        labelled = wait_for(
            "labelled awake",
            lambda: cluster.pod_state("chat-0") == "awake" and time.monotonic(),
            timeout=30,
        )
        slept = wait_for("asleep", lambda: engine.sleep_calls > 0 and time.monotonic(), timeout=30)
    finally:
        operator.stop()
    # Its idle clock started when it was labelled awake; a cycle every 6 s would sleep it
    # 2 to 8 s after that.
    assert slept - labelled < 2.0 + 2.5
