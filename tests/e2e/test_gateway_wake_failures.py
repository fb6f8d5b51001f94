"""Held requests and the two things that can go wrong while they wait: the wake fails (the
hybrid-model KV-cache crash), or the Kubernetes API will not take the wake request."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_fixtures import GatewayThread, gateway, routable_pods, start_gateway
from stand_in import set_label, write_status
from waits import wait_for

from snooze.api import rbac
from snooze.api.agreed import SLEEP_STARTED_ANNOTATION as SLEEP_STARTED
from snooze.api.times import format_time, parse_time
from snooze.gateway.models.model import Key
from snooze.kube.api import KubeApi
from snooze.sandbox import Sandbox

from .conftest import Cluster, OperatorThread
from .test_gateway import MESSAGES, add_model, engine_config, wait_asleep

__all__ = ["gateway"]
CHAT = "/v1/chat/completions"


def body(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, "max_tokens": 2, **extra}


def run_as_printed(
    cluster: Cluster, command: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """A kubectl command a 503 printed, run on the sandbox as a person would; it succeeds."""
    kubeconfig = cluster.sandbox.write_kubeconfig(tmp_path / "kubeconfig")
    shown = subprocess.run(
        [*shlex.split(command), "--kubeconfig", str(kubeconfig)],
        env={**os.environ, "KUBECACHEDIR": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    return shown


@pytest.mark.needs("kubectl")
def test_a_known_wake_failure_answers_held_requests_at_once(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread, tmp_path: Path
) -> None:
    """The wake crashes, the operator reports it (wake.onFailure: Report) and never retries
    the hybrid crash: every held request gets 503 with the reason, long before the wake
    timeout (5 minutes here, the clients' own timeout 30 seconds)."""
    (engine,) = add_model(
        cluster,
        "crashy",
        spec={"wake": {"timeout": "5m", "onFailure": "Report"}},
        hybrid_wake_crash=True,
    )
    wait_asleep(cluster, gateway, "crashy")
    url = gateway.url + CHAT
    with ThreadPoolExecutor(3) as pool:
        held = [pool.submit(httpx.post, url, json=body("crashy"), timeout=30) for _ in range(2)]
        stream = pool.submit(streamed, url, body("crashy", stream=True))
        answers = [f.result() for f in held]
        events = stream.result()
    assert engine.wake_calls >= 1 and engine.is_sleeping
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert int(answer.headers["Retry-After"]) >= 1
        error = answer.json()["error"]
        assert error["code"] == "wake_failed"
        assert "HybridKVCacheReinit" in error["message"]
        assert "crashy-0" in error["message"]  # the condition's message names the pod
    # The command it says shows more works as printed, and shows the failure.
    command = re.search(r"`(kubectl [^`]+)`", error["message"])
    assert command, error["message"]
    shown = run_as_printed(cluster, command.group(1), tmp_path)
    assert "HybridKVCacheReinit" in shown.stdout
    assert ".. " not in error["message"]
    final = json.loads(events[-1].removeprefix("data: "))
    assert final["error"]["code"] == "wake_failed"
    assert cluster.pod_state("crashy-0") == "failed"

    # The failure stays known: the next request is answered at once too, and no second wake
    # of an engine that the operator will not retry is asked for.
    asked = gateway.call(lambda: gateway.g.wakes.written)
    again = httpx.post(url, json=body("crashy"), timeout=30)
    assert again.status_code == 503 and again.json()["error"]["code"] == "wake_failed"
    assert gateway.call(lambda: gateway.g.wakes.written) == asked

    # A gateway that does not expose model status (the default) tells an anonymous client the
    # reason and where to look, but not the pod, the engine's address or what it said.
    private = start_gateway(expose_model_status=False)
    try:
        told = httpx.post(private.url + CHAT, json=body("crashy"), timeout=30)
    finally:
        private.stop()
    assert told.status_code == 503 and told.json()["error"]["code"] == "wake_failed"
    message = told.json()["error"]["message"]
    assert "HybridKVCacheReinit" in message and "`kubectl describe im` in the model's" in message
    for secret in ("crashy-0", engine.address.split(":")[0], "http", "default"):
        assert secret not in message, message


def streamed(url: str, payload: dict[str, Any]) -> list[str]:
    with httpx.stream("POST", url, json=payload, timeout=30) as response:
        assert response.status_code == 200
        return [line for line in response.iter_lines() if line.startswith("data:")]


def test_under_restart_the_request_is_held_until_the_new_pod_serves(
    cluster: Cluster, operator: OperatorThread, gateway: GatewayThread
) -> None:
    """wake.onFailure: Restart: the operator deletes the crashed pod; its controller (played
    here by the test) creates a new one, which serves the held request."""
    spec = {"wake": {"onFailure": "Restart", "timeout": "5m"}}
    add_model(cluster, "phoenix", spec=spec, hybrid_wake_crash=True)
    wait_asleep(cluster, gateway, "phoenix")
    # From now on the model stays awake once woken, so that the new pod serves the request.
    cluster.patch_model("phoenix", {"spec": {"idle": {"after": "1h"}}})
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(httpx.post, gateway.url + CHAT, json=body("phoenix"), timeout=60)
        wait_for("the crashed pod deleted", lambda: cluster.pod("phoenix-0") is None, timeout=30)
        assert not held.done()
        fresh = cluster.create_pod(
            "phoenix-1", labels={"app": "phoenix"}, engine=engine_config("phoenix")
        )
        answer = held.result(60)
    assert answer.status_code == 200, answer.text
    assert fresh.seen["POST /v1/chat/completions"] == 1


def asleep_model(cluster: Cluster, name: str) -> None:
    """A model whose one pod is asleep, as the operator would report it (none runs here)."""
    cluster.create_pod(f"{name}-0", labels={"app": name, "snooze.dev/state": "asleep"})
    cluster.create_model(name, {"selector": {"matchLabels": {"app": name}}})
    write_status(cluster, name, model_name=name, pods={f"{name}-0": "asleep"})


def known(gw: GatewayThread, key: Key) -> bool:
    return gw.call(lambda: gw.g.registry.get(key) is not None and gw.g.registry.ready)


def wake_metric(gw: GatewayThread, model: str) -> float | None:
    return gw.metrics.registry.get_sample_value(
        "snooze_gateway_wake_requests_total", {"namespace": "default", "model": model}
    )


def check_fast_503s(answers: list[httpx.Response], api_url: str) -> None:
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert int(answer.headers["Retry-After"]) >= 1
        error = answer.json()["error"]
        assert error["code"] == "wake_request_failed"
        # What went wrong with the API is logged, not told to clients.
        for leak in ("/apis", "/api/", "http", api_url, "127.0.0.1", "injected"):
            assert leak not in error["message"], error["message"]


def test_an_api_refusing_wake_requests_gives_fast_503s_from_one_writer(
    cluster: Cluster, sandbox: Sandbox
) -> None:
    asleep_model(cluster, "m")
    gw = start_gateway(wake_request_timeout=1.0)
    try:
        wait_for("the gateway knows m", lambda: known(gw, ("default", "m")))
        sandbox.inject_fault(method="PATCH", path_contains="/inferencemodels/m", times=10**6)
        before = sandbox.requests_count("PATCH")
        with ThreadPoolExecutor(50) as pool:
            answers = list(
                pool.map(lambda _: httpx.post(gw.url + CHAT, json=body("m"), timeout=15), range(50))
            )
        check_fast_503s(answers, sandbox.url)
        # One writer tried for all fifty (the API client retries a few times within the bound).
        assert sandbox.requests_count("PATCH") - before <= 12
        assert wake_metric(gw, "m") == 0
        assert routable_pods(gw, "m") == 0
    finally:
        gw.stop()


def test_an_api_that_cannot_be_reached_gives_fast_503s(cluster: Cluster, sandbox: Sandbox) -> None:
    asleep_model(cluster, "m")
    gw = start_gateway(wake_request_timeout=1.0)
    try:
        wait_for("the gateway knows m", lambda: known(gw, ("default", "m")))
        api_url = sandbox.url
        sandbox.stop()  # the API server is gone: connections are refused
        with ThreadPoolExecutor(20) as pool:
            answers = list(
                pool.map(lambda _: httpx.post(gw.url + CHAT, json=body("m"), timeout=15), range(20))
            )
        check_fast_503s(answers, api_url)
        assert wake_metric(gw, "m") == 0
    finally:
        gw.stop()


def test_the_gateway_asks_the_api_only_for_what_its_rbac_grants(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox checks no permissions: record every call the gateway makes through a wake,
    as the verb RBAC would check, against the rules the chart grants it (rbac.GATEWAY)."""
    calls: set[tuple[str, str]] = set()
    request, watch = KubeApi.request, KubeApi.watch

    def verb(method: str, path: str, params: Any) -> tuple[str, str]:
        resource = next(r for r in ("inferencemodels", "pods") if f"/{r}" in path)
        item = not path.rstrip("/").endswith(resource)
        verbs = {"GET": "get" if item else "list", "PATCH": "patch", "POST": "create"}
        return verbs.get(method, method.lower()), resource

    async def recorded_request(self: KubeApi, method: str, path: str, **kw: Any) -> Any:
        calls.add(verb(method, path, kw.get("params")))
        return await request(self, method, path, **kw)

    def recorded_watch(self: KubeApi, ref: Any, **kw: Any) -> Any:
        calls.add(("watch", verb("GET", ref.path, None)[1]))
        return watch(self, ref, **kw)

    monkeypatch.setattr(KubeApi, "request", recorded_request)
    monkeypatch.setattr(KubeApi, "watch", recorded_watch)
    cluster.create_pod("m-0", labels={"app": "m", "snooze.dev/state": "asleep"}, model="m")
    cluster.create_model("m", {"selector": {"matchLabels": {"app": "m"}}})
    write_status(cluster, "m", model_name="m", pods={"m-0": "asleep"})
    gw = start_gateway()
    try:
        wait_for("the gateway knows m", lambda: known(gw, ("default", "m")))
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(httpx.post, gw.url + CHAT, json=body("m"), timeout=30)
            wait_for("a wake asked for", lambda: gw.call(lambda: gw.g.wakes.written) == 1)
            set_label(cluster, "m-0", "awake")  # the operator's part
            write_status(cluster, "m", model_name="m", pods={"m-0": "awake"})
            assert waiting.result(30).status_code == 200
    finally:
        gw.stop()
    granted = {(v, p.resource) for p in rbac.GATEWAY for v in p.verbs}
    assert calls - granted == set(), f"calls outside the gateway's RBAC: {calls - granted}"
    assert ("patch", "inferencemodels") in calls


def test_a_held_request_asks_again_when_its_wake_ended_in_sleep(cluster: Cluster) -> None:
    """The pod the wake brought up was put back to sleep before the held request got it (a
    drain that raced the wake, or a freshly started pod judged idle): the request's wake is
    over, so the gateway asks again, and the operator (played here) wakes it only for a
    request newer than that sleep. The operator's clock runs half a second ahead of the
    gateway's: the gateway asks again once, not in a loop."""
    asleep_model(cluster, "m")
    gw = start_gateway()
    try:
        wait_for("the gateway knows m", lambda: known(gw, ("default", "m")))
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(httpx.post, gw.url + CHAT, json=body("m"), timeout=30)
            first = wait_for("a wake asked for", lambda: requested(cluster, "m"))
            # The operator drained and slept the pod after that request.
            slept = first + 0.5
            cluster._check(
                cluster.http.patch(
                    "/api/v1/namespaces/default/pods/m-0",
                    json={"metadata": {"annotations": {SLEEP_STARTED: format_time(slept)}}},
                    headers={"Content-Type": "application/merge-patch+json"},
                )
            )
            again = wait_for(
                "a newer wake asked for", lambda: (t := requested(cluster, "m")) > slept and t
            )
            assert again > slept
            set_label(cluster, "m-0", "awake")
            write_status(cluster, "m", model_name="m", pods={"m-0": "awake"})
            assert waiting.result(30).status_code == 200
        assert gw.call(lambda: gw.g.wakes.written) == 2
    finally:
        gw.stop()


def requested(cluster: Cluster, name: str) -> float:
    annotations = cluster.model(name)["metadata"].get("annotations") or {}
    return parse_time(annotations.get("snooze.dev/wake-requested-at")) or 0.0
