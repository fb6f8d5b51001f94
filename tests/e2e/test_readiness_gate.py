"""The snooze.dev/awake readiness gate, end to end: a pod that lists it is told "False" before
its drain begins (while a request still runs on its engine) and "True" only once a wake is done
and checked; a wake that comes back answering wrong never makes it True; a pod without the gate
is never written to. Watched from outside, through the API's own watch of the pods."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from gated_pods import GATE, gate_of, report_running
from waits import wait_for

from snooze.operator.embedded import OperatorThread
from snooze.sim import EngineConfig, SimulatedEngine

from .conftest import PODS, Cluster, next_address

LABELS = {"app": "chat"}


def add_engine_pod(
    cluster: Cluster, name: str, *, gated: bool, **engine_options: Any
) -> SimulatedEngine:
    """A Running pod with a simulated engine at its address, its containers ready; with the
    gate it is not Ready (the kubelet finds no snooze.dev/awake condition yet)."""
    options = {"sleep_seconds": 0.05, "wake_seconds": 0.05, "checksum_seconds_per_gib": 0.001}
    config = EngineConfig(
        model="m", host=next_address(), port=8000, **{**options, **engine_options}
    )
    engine = cluster.sim.add(config)
    cluster.engines[name] = engine
    spec: dict[str, Any] = {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}
    if gated:
        spec["readinessGates"] = [{"conditionType": GATE}]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": cluster.ns, "labels": LABELS},
        "spec": spec,
    }
    cluster.http.post(PODS.format(ns=cluster.ns), json=pod).raise_for_status()
    report_running(cluster, name, config.host, gated=gated)
    return engine


class PodWatch:
    """Every version of the namespace's pods, as the API's watch delivers them."""

    def __init__(self, cluster: Cluster) -> None:
        self.url = cluster.sandbox.url + PODS.format(ns=cluster.ns)
        self.seen: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with (
            httpx.Client(timeout=None) as http,
            http.stream("GET", self.url, params={"watch": "1"}) as response,
        ):
            for line in response.iter_lines():
                if self._stop.is_set():
                    return
                if line:
                    self.seen.append(json.loads(line)["object"])

    def stop(self) -> None:
        self._stop.set()

    def versions(self, name: str) -> list[dict[str, Any]]:
        return [pod for pod in list(self.seen) if pod["metadata"]["name"] == name]


def state_of(pod: dict[str, Any]) -> str | None:
    return (pod["metadata"].get("labels") or {}).get("snooze.dev/state")


def history(watch: PodWatch, name: str) -> list[tuple[str | None, tuple[str, str] | None]]:
    """(state label, gate) of each version of the pod, repeats dropped."""
    out: list[tuple[str | None, tuple[str, str] | None]] = []
    for pod in watch.versions(name):
        step = (state_of(pod), gate_of(pod))
        if not out or out[-1] != step:
            out.append(step)
    return out


@pytest.fixture
def watch(cluster: Cluster) -> Iterator[PodWatch]:
    w = PodWatch(cluster)
    yield w
    w.stop()


def stream(engine: SimulatedEngine, answer: list[int]) -> threading.Thread:
    """A request straight to the engine (as a picker would send it) that runs for a while."""

    def send() -> None:
        body = {"model": "m", "prompt": "x", "max_tokens": 40, "stream": False}
        reply = httpx.post(f"{engine.url}/v1/completions", json=body, timeout=30)
        answer.append(reply.status_code)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_the_gate_goes_false_before_the_drain_and_true_after_a_checked_wake(
    cluster: Cluster, operator: OperatorThread, watch: PodWatch
) -> None:
    engine = add_engine_pod(cluster, "chat-0", gated=True, token_seconds=0.05)
    cluster.create_model(
        "chat", {"modelName": "m", "selector": {"matchLabels": LABELS}, "idle": {"after": "1h"}}
    )
    wait_for("the gate True", lambda: gate_of(cluster.pod("chat-0") or {}) == ("True", "Awake"))
    assert cluster.pod_state("chat-0") == "awake"

    # A request runs on the engine when the model is told to sleep: the drain waits for it,
    # and the pod leaves its Services before that wait begins, while the request still runs.
    answers: list[int] = []
    request = stream(engine, answers)
    wait_for("the request running", lambda: engine.running == 1)
    cluster.patch_model("chat", {"spec": {"desiredState": "Asleep"}})
    wait_for(
        "the gate False", lambda: gate_of(cluster.pod("chat-0") or {}) == ("False", "Draining")
    )
    assert engine.running == 1 and not engine.is_sleeping, "the gate went False after the drain"
    request.join(30)
    assert answers == [200], "the running request was cut off"
    wait_for("asleep", lambda: gate_of(cluster.pod("chat-0") or {}) == ("False", "Asleep"))
    assert engine.is_sleeping

    cluster.patch_model("chat", {"spec": {"desiredState": "Auto"}})
    cluster.request_wake("chat")
    wait_for("the gate True", lambda: gate_of(cluster.pod("chat-0") or {}) == ("True", "Awake"))
    assert not engine.is_sleeping
    # The order, as the API saw it: out of the pool before the draining label, and back in
    # only with (after) the awake label that follows the checked wake.
    wait_for(
        "the watch to catch up",
        lambda: history(watch, "chat-0")[-1] == ("awake", ("True", "Awake")),
    )
    steps = history(watch, "chat-0")
    after_first_awake = steps[steps.index(("awake", ("True", "Awake"))) :]
    assert after_first_awake == [
        ("awake", ("True", "Awake")),
        ("awake", ("False", "Draining")),
        ("draining", ("False", "Draining")),
        ("draining", ("False", "Asleep")),
        ("asleep", ("False", "Asleep")),
        ("asleep", ("False", "Waking")),
        ("waking", ("False", "Waking")),
        ("awake", ("False", "Waking")),
        ("awake", ("True", "Awake")),
    ], steps


def test_a_wake_that_answers_wrong_never_opens_the_gate(
    cluster: Cluster, operator: OperatorThread, watch: PodWatch
) -> None:
    engine = add_engine_pod(cluster, "chat-0", gated=True, wake_changes_output=True)
    spec = {
        "modelName": "m",
        "selector": {"matchLabels": LABELS},
        "idle": {"after": "1s"},
        "wake": {"onFailure": "Report"},
    }
    cluster.create_model("chat", spec)
    wait_for("asleep", lambda: gate_of(cluster.pod("chat-0") or {}) == ("False", "Asleep"))
    cluster.request_wake("chat")
    wait_for(
        "the failed wake on the gate",
        lambda: gate_of(cluster.pod("chat-0") or {}) == ("False", "WakeFailed"),
    )
    assert engine.wake_calls == 1 and cluster.pod_state("chat-0") == "failed"
    gates = [gate_of(p) for p in watch.versions("chat-0")]
    opened = gates.index(("True", "Awake"))
    assert ("True", "Awake") not in gates[gates.index(("False", "Asleep"), opened) :], gates


def test_a_pod_without_the_gate_is_never_written_to(
    cluster: Cluster, operator: OperatorThread, watch: PodWatch
) -> None:
    """Two replicas, one gated: each sleeps and wakes; only the gated one's status is written.
    A fault armed on the other's pods/status catches any write the operator sends there."""
    gated = add_engine_pod(cluster, "gated-0", gated=True)
    plain = add_engine_pod(cluster, "plain-0", gated=False)
    cluster.sandbox.inject_fault(
        method="PATCH", path_contains="/pods/plain-0/status", status=418, times=1
    )
    cluster.create_model(
        "chat", {"modelName": "m", "selector": {"matchLabels": LABELS}, "idle": {"after": "1s"}}
    )
    wait_for("both asleep", lambda: gated.is_sleeping and plain.is_sleeping)
    wait_for("the gate False", lambda: gate_of(cluster.pod("gated-0") or {}) == ("False", "Asleep"))
    cluster.request_wake("chat")
    wait_for("both awake", lambda: cluster.status("chat").get("awake") == 2)
    wait_for("the gate True", lambda: gate_of(cluster.pod("gated-0") or {}) == ("True", "Awake"))

    statuses = {json.dumps(p.get("status"), sort_keys=True) for p in watch.versions("plain-0")}
    assert len(statuses) == 1 and GATE not in statuses.pop()
    probe = cluster.http.patch(
        f"{PODS.format(ns=cluster.ns)}/plain-0/status",
        json={"status": {}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert probe.status_code == 418, "the operator wrote the status of a pod without the gate"


def test_an_engine_that_stops_answering_leaves_the_pool_and_comes_back(
    cluster: Cluster, operator: OperatorThread
) -> None:
    """The kubelet's probe of /health may lag, or pass on a frozen engine: the gate follows
    Snooze's own probes, out at the second probe without an answer, back once one comes."""
    engine = add_engine_pod(cluster, "chat-0", gated=True)
    cluster.create_model("chat", {"modelName": "m", "selector": {"matchLabels": LABELS}})
    wait_for("in the pool", lambda: gate_of(cluster.pod("chat-0")) == ("True", "Awake"))
    cluster.sim.kill(engine)
    wait_for("out of it", lambda: gate_of(cluster.pod("chat-0")) == ("False", "Unreachable"))
    cluster.sim.restart(engine)
    wait_for("back in", lambda: gate_of(cluster.pod("chat-0")) == ("True", "Awake"))


def test_a_deleted_model_hands_its_gated_pods_back_awake_and_in_the_pool(
    cluster: Cluster, operator: OperatorThread
) -> None:
    engine = add_engine_pod(cluster, "chat-0", gated=True)
    cluster.create_model(
        "chat", {"modelName": "m", "selector": {"matchLabels": LABELS}, "idle": {"after": "1s"}}
    )
    wait_for("asleep", lambda: gate_of(cluster.pod("chat-0")) == ("False", "Asleep"))
    deleted = cluster.http.delete(
        "/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels/chat"
    )
    assert deleted.status_code in (200, 202), deleted.text
    # The gate is written before the label is dropped: wait for the whole hand-back.
    wait_for(
        "handed back",
        lambda: (
            gate_of(cluster.pod("chat-0")) == ("True", "Released")
            and cluster.pod_state("chat-0") is None
        ),
    )
    assert not engine.is_sleeping
