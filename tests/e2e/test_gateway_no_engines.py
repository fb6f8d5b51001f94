"""A model that nothing will ever serve is answered at once, not after its wake timeout: its
selector matches no pod and it has no workload for Snooze to scale up. A pod that is only
starting is waited for, and a model at zero replicas that Snooze can scale up is woken."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from processes import GatewayProcess, running_gateway
from waits import wait_for

from snooze.api.agreed import HELD_REQUESTS, WAKE_REQUESTED_ANNOTATION
from snooze.demo.controller import ReplicaSetStandIn, deployment

from .conftest import Cluster, OperatorThread, _addresses
from .test_gateway import MESSAGES, engine_config
from .test_gateway_wake_failures import run_as_printed

CHAT = "/v1/chat/completions"
LABELS = {"app": "ghost"}
# The wake timeout is left at its default (2m): the clients here give up long before it.
SPEC = {"selector": {"matchLabels": LABELS}}
CLIENT_TIMEOUT = 30.0


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "ghost", "messages": MESSAGES, "max_tokens": 2, **extra}


@pytest.fixture
def gateway_process(cluster: Cluster, tmp_path: Path) -> Iterator[GatewayProcess]:
    with running_gateway(tmp_path / "gateway.log") as process:
        yield process


def ready_reason(cluster: Cluster) -> str | None:
    condition = cluster.condition("ghost", "Ready")
    return None if condition is None else str(condition["reason"])


def gateway_pods(gw: GatewayProcess) -> int | None:
    """How many pods of the model the gateway sees, once it routes the name to the model."""
    for entry in httpx.get(gw.url + "/v1/models").json()["data"]:
        if entry["id"] == "ghost" and entry["snooze"]["namespace"] == "default":
            return int(entry["snooze"]["pods"])
    return None


def assert_no_engines(answer: httpx.Response) -> str:
    """A 503 in OpenAI's shape that says why and when to retry; its message."""
    assert answer.status_code == 503, answer.text
    assert int(answer.headers["Retry-After"]) >= 1
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "model_has_no_engines")
    message = str(error["message"])
    assert "'ghost'" in message and "(NoPods)" in message, message
    return message


@pytest.mark.needs("kubectl")
def test_a_model_with_no_pods_is_answered_at_once(
    cluster: Cluster, operator: OperatorThread, gateway_process: GatewayProcess, tmp_path: Path
) -> None:
    gw = gateway_process
    cluster.create_model("ghost", SPEC)
    wait_for("Ready=False, NoPods", lambda: ready_reason(cluster) == "NoPods")
    wait_for("the gateway to list it", lambda: gateway_pods(gw) == 0)
    # Nothing is checked where no engine is: the status claims no verification.
    verified = cluster.condition("ghost", "WakeVerified")
    assert verified is not None
    assert (verified["status"], verified["reason"]) == ("Unknown", "NoEngine"), verified
    assert "0 engine" not in verified["message"], verified

    answer = httpx.post(gw.url + CHAT, json=body(), timeout=CLIENT_TIMEOUT)
    message = assert_no_engines(answer)
    # A stream gets the same answer: no 200 begun for a wait that cannot end well.
    with httpx.stream(
        "POST", gw.url + CHAT, json=body(stream=True), timeout=CLIENT_TIMEOUT
    ) as streamed:
        streamed.read()
    assert assert_no_engines(streamed) == message
    # Nothing to wake: no wake request was written.
    annotations = cluster.model("ghost")["metadata"].get("annotations") or {}
    assert WAKE_REQUESTED_ANNOTATION not in annotations
    rejected = gw.sample(
        "snooze_gateway_rejected_requests_total", model="ghost", reason="unavailable"
    )
    assert rejected == 2

    # The command it gives (the gateway runs with --expose-model-status) runs as printed.
    command = re.search(r"`(kubectl get pods [^`]+)`", message)
    assert command, message
    assert shlex.split(command.group(1))[3:] == ["-l", "app=ghost", "-n", "default"]
    shown = run_as_printed(cluster, command.group(1), tmp_path)
    assert "No resources found in default namespace." in shown.stderr


def test_a_starting_pod_is_waited_for_and_one_gone_answers_the_held_at_once(
    cluster: Cluster, operator: OperatorThread, gateway_process: GatewayProcess
) -> None:
    gw = gateway_process
    cluster.create_model("ghost", SPEC)
    wait_for("Ready=False, NoPods", lambda: ready_reason(cluster) == "NoPods")

    def held_while(pod: str) -> Future[httpx.Response]:
        """A request sent once the gateway sees `pod`, still loading; back once it is held."""
        cluster.create_pod(pod, labels=LABELS, engine=engines[pod], ready=False)
        wait_for("the gateway to see the pod", lambda: gateway_pods(gw) == 1)
        held = pool.submit(httpx.post, gw.url + CHAT, json=body(), timeout=CLIENT_TIMEOUT)
        wait_for("the request held", lambda: gw.sample(HELD_REQUESTS, model="ghost") == 1)
        return held

    engines = {pod: engine_config("ghost") for pod in ("ghost-0", "ghost-1")}
    with ThreadPoolExecutor(1) as pool:
        # A pod that never loads is deleted: the request that waited for it is answered once
        # the operator says no pod is left and no controller has recreated it for
        # POD_RETURN_SECONDS, long before its wake timeout.
        held = held_while("ghost-0")
        cluster.delete_pod("ghost-0")
        assert_no_engines(held.result())
        wait_for("the gateway to see it gone", lambda: gateway_pods(gw) == 0)
        # A pod that loads: waited for, whatever the status said a moment before.
        held = held_while("ghost-1")
        cluster.set_pod_ready("ghost-1", engines["ghost-1"].host, ready=True)
        answer = held.result()
    assert answer.status_code == 200, answer.text
    assert float(answer.headers["x-snooze-held-seconds"]) > 0


def test_zero_replicas_that_snooze_can_scale_up_are_woken(
    cluster: Cluster, operator: OperatorThread, gateway_process: GatewayProcess
) -> None:
    """Its workload at zero by someone's hand: the operator says NoPods as for a model with
    none, but a request asks it to scale the workload up, and is held until it serves."""
    gw = gateway_process
    stand_in = ReplicaSetStandIn(
        url=cluster.sandbox.url,
        sim=cluster.sim,
        addresses=_addresses,
        startup_seconds=0.5,
        model="ghost",
    ).start()
    try:
        cluster.http.post(
            "/apis/apps/v1/namespaces/default/deployments",
            json=deployment("ghost", replicas=0, labels=LABELS),
        ).raise_for_status()
        cluster.create_model(
            "ghost", {**SPEC, "scaleTargetRef": {"kind": "Deployment", "name": "ghost"}}
        )
        wait_for("Ready=False, NoPods", lambda: ready_reason(cluster) == "NoPods")
        wait_for("the gateway to list it", lambda: gateway_pods(gw) == 0)
        answer = httpx.post(gw.url + CHAT, json=body(), timeout=CLIENT_TIMEOUT)
        assert answer.status_code == 200, answer.text
        assert float(answer.headers["x-snooze-held-seconds"]) >= 0.5  # a cold start
    finally:
        stand_in.stop()
