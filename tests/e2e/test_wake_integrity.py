"""A woken engine answers as it did before it slept, or it does not serve: the real operator and
gateway against simulated engines that wake wrong (docs/wake-verification.md). What the client
received through the gateway is the proof, not the status alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from gateway_fixtures import GatewayThread, gateway
from waits import wait_for

from snooze.sim import SimulatedEngine

from .conftest import FAST, Cluster, OperatorThread
from .test_gateway import MESSAGES, add_model, engine_config, wait_asleep

__all__ = ["gateway"]
CHAT = "/v1/chat/completions"
# What a healthy simulated engine answers to two tokens (the filler's first words).
HEALTHY = "lorem ipsum"


def ask(gw: GatewayThread, model: str, timeout: float = 60) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 2}
    return httpx.post(gw.url + CHAT, json=body, timeout=timeout)


def pod_entry(cluster: Cluster, model: str, pod: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        (p for p in cluster.status(model).get("pods") or [] if p["name"] == pod), {}
    )
    return found


def verification(cluster: Cluster, model: str, pod: str) -> dict[str, Any]:
    found: dict[str, Any] = pod_entry(cluster, model, pod).get("verification") or {}
    return found


def served_requests(engine: SimulatedEngine) -> int:
    """Requests from clients: the operator's checks go to /v1/completions, clients here only
    ever send chat requests."""
    return engine.seen["POST /v1/chat/completions"]


def test_a_wake_that_answers_differently_is_never_served_and_the_pod_restarts(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    """wake.onFailure: Restart, the default. The held request waits while the operator deletes
    the pod; the pod its controller (the test here) makes serves it, the right answer."""
    (broken,) = add_model(
        cluster, "chat", spec={"wake": {"timeout": "30s"}}, wake_changes_output=True
    )
    wait_asleep(cluster, gateway, "chat")
    assert verification(cluster, "chat", "chat-0")["output"] == "Recorded"
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(ask, gateway, "chat")
        wait_for("the pod deleted", lambda: cluster.pod("chat-0") is None, timeout=30)
        assert not held.done()
        fresh = cluster.create_pod("chat-1", labels={"app": "chat"}, engine=engine_config("chat"))
        answer = held.result(60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == HEALTHY
    assert served_requests(broken) == 0 and served_requests(fresh) == 1
    assert broken.wake_calls == 1  # it woke; it answered wrong; it was never routed to
    [event] = [e for e in cluster.events("WakeFailed") if "OutputMismatch" in e["message"]]
    assert "answers differently than before its sleep" in event["message"]
    assert "weight tensors match" in event["message"]  # the weights were not what changed
    [restart] = cluster.events("PodRestarted")
    assert "OutputMismatch" in restart["message"]


def test_under_report_the_engine_stays_failed_and_clients_are_told(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    """wake.onFailure: Report: the engine is labelled failed and never routed to; held and
    later requests get 503 saying why at once, until the engine's container restarts."""
    spec = {"wake": {"timeout": "30s", "onFailure": "Report"}}
    (broken,) = add_model(cluster, "chat", spec=spec, wake_changes_output=True)
    cluster.set_container_restarts("chat-0", 0)
    wait_asleep(cluster, gateway, "chat")
    assert verification(cluster, "chat", "chat-0")["restarts"] == 0
    answer = ask(gateway, "chat")
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "wake_failed"
    assert "OutputMismatch" in answer.json()["error"]["message"]
    assert cluster.pod_state("chat-0") == "failed"
    entry = pod_entry(cluster, "chat", "chat-0")
    assert entry["state"] == "failed" and entry["failureReason"] == "OutputMismatch"
    assert entry["verification"]["output"] == "Mismatch"
    again = ask(gateway, "chat")
    assert again.status_code == 503 and served_requests(broken) == 0
    assert broken.is_sleeping is False  # awake, wrong, and unrouted

    # Its container restarts: a new run of the engine, checked afresh, serves again.
    cluster.sim.restart(broken)
    cluster.set_container_restarts("chat-0", 1)
    wait_for("published awake again", lambda: cluster.pod_state("chat-0") == "awake", timeout=30)
    answer = ask(gateway, "chat")
    assert (
        answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == HEALTHY
    )


def test_wrong_weights_after_a_level_2_wake_restart_the_engine(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    """A level-2 wake reloads the weights: their digests are compared once the engine serves.
    One tensor came back wrong: a short greedy answer does not show it, the digests do; the
    engine is taken out of service and its pod restarted."""
    spec = {"sleep": {"level": 2}, "wake": {"timeout": "30s"}}
    # The digests of its 16 GiB take 3 s: long enough for the request to be routed first.
    (engine,) = add_model(
        cluster, "chat", spec=spec, wake_corrupts_weights=True, checksum_seconds_per_gib=0.2
    )
    wait_asleep(cluster, gateway, "chat")
    recorded = verification(cluster, "chat", "chat-0")
    assert recorded["weights"] == "Recorded" and recorded["weightTensors"] > 0
    answer = ask(gateway, "chat")
    # Published awake once it answered as before: the weights' check holds no request (the
    # engine itself generates nothing while it hashes, as vLLM's utility call holds its loop).
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == HEALTHY
    assert engine.checksum_calls == 2  # recorded before the sleep, compared after the wake
    wait_for("the pod deleted", lambda: cluster.pod("chat-0") is None, timeout=30)
    [event] = [e for e in cluster.events("WakeFailed") if "WeightsMismatch" in e["message"]]
    assert "1 of" in event["message"] and "down_proj" in event["message"]


def test_a_model_whose_greedy_answer_varies_is_not_checked_and_says_so(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    (engine,) = add_model(cluster, "chat", nondeterministic=True)
    wait_asleep(cluster, gateway, "chat")
    assert verification(cluster, "chat", "chat-0")["output"] == "NotDeterministic"
    condition = cluster.condition("chat", "WakeVerified")
    assert condition is not None and condition["status"] == "False"
    assert condition["reason"] == "NotDeterministic"
    for _ in range(2):  # no false alarm: it wakes and serves, again and again
        answer = ask(gateway, "chat")
        assert answer.status_code == 200, answer.text
        wait_asleep(cluster, gateway, "chat")
    assert engine.wake_calls == 2 and not cluster.events("WakeFailed")


def test_a_restarted_operator_checks_against_the_record_its_predecessor_wrote(
    cluster: Cluster, gateway: GatewayThread
) -> None:
    """The record is on the model's status: an operator started after the engine slept still
    catches the wrong wake, and the client still never gets the wrong answer."""
    spec = {"wake": {"timeout": "30s", "onFailure": "Report"}}
    first = OperatorThread(FAST).start()
    try:
        (broken,) = add_model(cluster, "chat", spec=spec, wake_changes_output=True)
        wait_asleep(cluster, gateway, "chat")
        wait_for(
            "the record written",
            lambda: verification(cluster, "chat", "chat-0").get("baseline"),
        )
    finally:
        first.stop()
    second = OperatorThread(FAST).start()
    try:
        answer = ask(gateway, "chat")
    finally:
        second.stop()
    assert answer.status_code == 503 and "OutputMismatch" in answer.json()["error"]["message"]
    assert served_requests(broken) == 0
