"""A step cut off in the middle (the operator stopped, or the engine froze) is resumed, not
repeated or orphaned, and what happened meanwhile is told by an Event.

Each test puts a pod and its engine exactly where an operator that stopped at one step left
them (labels and progress marks on the pod, the engine driven over its own HTTP API), then
starts an operator, and asserts on what the engine saw.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from waits import wait_for

from snooze.api.times import format_time
from snooze.sim.engine import GARBAGE_MARKER

from .conftest import FAST, Cluster, OperatorThread, _addresses

LABELS = {"app": "chat"}
PODS = "/api/v1/namespaces/default/pods"


def mark(cluster: Cluster, pod: str, *, label: str, **annotations: str | None) -> None:
    """Leave the pod as an operator stopped at some step would have."""
    patch = {
        "metadata": {
            "labels": {"snooze.dev/state": label},
            "annotations": {f"snooze.dev/{k.replace('_', '-')}": v for k, v in annotations.items()},
        }
    }
    response = cluster.http.patch(
        f"{PODS}/{pod}", json=patch, headers={"Content-Type": "application/merge-patch+json"}
    )
    assert response.status_code == 200, response.text


def annotations(cluster: Cluster, pod: str) -> dict[str, str]:
    found = cluster.pod(pod)
    assert found is not None
    return dict(found["metadata"].get("annotations") or {})


def ago(seconds: float) -> str:
    return format_time(time.time() - seconds)


@pytest.fixture
def started(sandbox: object) -> Iterator[list[OperatorThread]]:
    """Operators started by the test (after it has set the scene), stopped at the end."""
    threads: list[OperatorThread] = []
    yield threads
    for thread in threads:
        thread.stop()


def test_a_drain_cut_off_before_its_sleep_was_sent_is_resumed_at_once(
    cluster: Cluster, started: list[OperatorThread]
) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS)
    mark(cluster, "chat-0", label="draining", sleep_started_at=ago(5))
    # idle.after is long: the sleep goes on because it was decided before, not because of it.
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "1h"}})
    started.append(OperatorThread(FAST).start())
    # Before, the label stood for drain timeout + sleep timeout (62 s here), then went awake.
    wait_for("asleep", lambda: engine.is_sleeping and cluster.pod_state("chat-0") == "asleep")
    assert engine.sleep_calls == 1
    assert "snooze.dev/sleep-sent-at" in annotations(cluster, "chat-0")
    wait_for("the Slept event", lambda: cluster.events("Slept"))


def test_a_sleep_already_sent_is_not_sent_again(
    cluster: Cluster, started: list[OperatorThread]
) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS, sleep_seconds=1.5)
    # The stopped operator's /sleep, still running inside the engine.
    sender = threading.Thread(
        target=httpx.post, args=(f"{engine.url}/sleep",), kwargs={"params": {"level": 1}}
    )
    sender.start()
    wait_for("the engine sleeping", lambda: engine.ops_in_flight.get("sleep") == 1)
    mark(cluster, "chat-0", label="draining", sleep_started_at=ago(1), sleep_sent_at=ago(0.5))
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "1s"}})
    started.append(OperatorThread(FAST).start())
    wait_for("asleep", lambda: cluster.pod_state("chat-0") == "asleep")
    sender.join()
    assert engine.sleep_calls == 1
    slept = wait_for("the Slept event", lambda: cluster.events("Slept"))
    assert "did not see end" in slept[0]["message"]


def test_a_sleep_marked_sent_that_never_arrived_is_sent_at_once(
    cluster: Cluster, started: list[OperatorThread]
) -> None:
    # The operator stopped between marking the /sleep sent and sending it: the engine, awake,
    # says no sleep is under way (vLLM 0.32+), so waiting out the sleep's timeout (two
    # minutes here) would only orphan the drain.
    engine = cluster.create_pod("chat-0", labels=LABELS)
    mark(cluster, "chat-0", label="draining", sleep_started_at=ago(2), sleep_sent_at=ago(1))
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "1h"}})
    started.append(OperatorThread(FAST).start())
    wait_for("asleep", lambda: engine.is_sleeping and cluster.pod_state("chat-0") == "asleep")
    assert engine.op_durations["sleep"].count == 1


def test_a_level_two_wake_resumes_after_its_reload(
    cluster: Cluster, started: list[OperatorThread]
) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS, reload_seconds=0.5)
    for path, params, body in (
        ("/sleep", {"level": 2}, None),
        ("/wake_up", {"tags": "weights"}, None),
        ("/collective_rpc", None, {"method": "reload_weights"}),
    ):
        httpx.post(f"{engine.url}{path}", params=params, json=body, timeout=10).raise_for_status()
    assert engine.is_sleeping and engine.weights_valid
    mark(
        cluster,
        "chat-0",
        label="waking",
        sleep_started_at=ago(60),
        wake_progress="reload_weights,weights",
    )
    cluster.create_model(
        "chat",
        {"selector": {"matchLabels": LABELS}, "idle": {"after": "1h"}, "sleep": {"level": 2}},
    )
    cluster.request_wake("chat", at=time.time() - 30)
    started.append(OperatorThread(FAST).start())
    wait_for("awake", lambda: cluster.pod_state("chat-0") == "awake" and not engine.is_sleeping)
    assert engine.seen["POST /collective_rpc"] == 1  # not reloaded a second time
    assert "snooze.dev/wake-progress" not in annotations(cluster, "chat-0")
    answer = httpx.post(
        f"{engine.url}/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2}
    )
    assert GARBAGE_MARKER not in answer.json()["choices"][0]["text"]


def test_an_engine_that_stops_answering_is_no_longer_reported_awake(
    cluster: Cluster, started: list[OperatorThread]
) -> None:
    engine = cluster.create_pod("chat-0", labels=LABELS)
    cluster.create_model("chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "1h"}})
    started.append(OperatorThread(FAST).start())
    wait_for("awake", lambda: cluster.status("chat").get("awake") == 1)
    cluster.sim.kill(engine)
    entry = wait_for(
        "unreachable",
        lambda: next(
            (p for p in cluster.status("chat")["pods"] if p["state"] == "unreachable"), None
        ),
    )
    assert engine.url in entry["message"]
    assert cluster.status("chat")["awake"] == 0
    [event] = wait_for("the event", lambda: cluster.events("EngineUnreachable"))
    assert engine.url in event["message"]
    cluster.sim.restart(engine)
    wait_for("awake again", lambda: cluster.status("chat").get("awake") == 1)
    wait_for("the event", lambda: cluster.events("EngineReachable"))


def test_an_engine_frozen_during_its_sleep_is_never_published_awake(
    cluster: Cluster, started: list[OperatorThread]
) -> None:
    host = next(_addresses)
    command = [sys.executable, "-m", "snooze.cli", "sim", "--host", host, "--model", "m"]
    # No weights' digests before the first sleep (16 s for the simulator's 16 GiB): this test
    # freezes the engine during the /sleep itself.
    fast = ["--sleep-seconds", "1.0", "--checksum-seconds-per-gib", "0"]
    sim = subprocess.Popen([*command, *fast, "--log-level", "WARNING"])
    try:
        wait_for("the engine up", lambda: _answers(f"http://{host}:8000/health"))
        cluster.http.post(
            PODS,
            json={
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "chat-0", "labels": LABELS},
            },
        ).raise_for_status()
        cluster.set_pod_ready("chat-0", host, ready=True)
        cluster.create_model(
            "chat",
            {
                "selector": {"matchLabels": LABELS},
                "idle": {"after": "1s"},
                "wake": {"timeout": "1s"},  # a /sleep may take as long as a wake
            },
        )
        settings = replace(FAST, min_sleep_timeout=1.0, probe_timeout=0.5)
        started.append(OperatorThread(settings).start())
        wait_for("sleep sent", lambda: "snooze.dev/sleep-sent-at" in annotations(cluster, "chat-0"))
        os.kill(sim.pid, signal.SIGSTOP)  # frozen in the middle of freeing its memory
        wait_for("the sleep given up", lambda: cluster.events("SleepFailed"))
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # the label must never say awake meanwhile
            assert cluster.pod_state("chat-0") == "draining"
            time.sleep(0.1)
        os.kill(sim.pid, signal.SIGCONT)
        wait_for("asleep once it answers", lambda: cluster.pod_state("chat-0") == "asleep")
    finally:
        os.kill(sim.pid, signal.SIGCONT)
        sim.terminate()
        sim.wait(10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
