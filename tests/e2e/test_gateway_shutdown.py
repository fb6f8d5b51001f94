"""`snooze gateway` as a process, sent SIGTERM mid-stream (a rollout, a node drain): it stops
being ready and taking connections, lets the stream and a held request finish, exits 0.

No operator runs: the test writes the labels and status it would (stand_in.py), and plays
its wake of the held request's model."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from ports import free_ports
from stand_in import set_label, write_status
from waits import wait_for

from .conftest import Cluster
from .test_gateway import MESSAGES, engine_config

CHAT = "/v1/chat/completions"


class GatewayProcess:
    def __init__(self, *flags: str) -> None:
        self.port, metrics_port = free_ports(2)
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        command = [sys.executable, "-m", "snooze.cli", "gateway", "--host", "127.0.0.1"]
        command += ["--metrics-port", str(metrics_port)]
        self.proc = subprocess.Popen(
            [*command, "--port", str(self.port), "--keepalive-seconds", "0.2", *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def ready(self) -> bool:
        try:
            return httpx.get(self.url + "/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def refuses_connections(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except ConnectionRefusedError:
            return True
        return False


@pytest.fixture
def models(cluster: Cluster) -> None:
    """`chat` awake (tokens every 50 ms) and `sleepy` asleep, as the operator reports them."""
    for name, state in (("chat", "awake"), ("sleepy", "asleep")):
        cluster.create_pod(
            f"{name}-0",
            labels={"app": name, "snooze.dev/state": state},
            engine=engine_config(name, token_seconds=0.05),
        )
        spec = {"selector": {"matchLabels": {"app": name}}, "wake": {"timeout": "5m"}}
        cluster.create_model(name, spec)
        write_status(cluster, name, model_name=name, pods={f"{name}-0": state})


@pytest.fixture
def process(request: pytest.FixtureRequest, models: None) -> Iterator[GatewayProcess]:
    gateway = GatewayProcess(*request.param)
    try:
        wait_for("the gateway ready", gateway.ready, timeout=30)
        yield gateway
    finally:
        if gateway.proc.poll() is None:
            gateway.proc.kill()
        gateway.proc.wait(10)


def stream(url: str, model: str, tokens: int) -> tuple[int, list[str]]:
    body = {"model": model, "messages": MESSAGES, "max_tokens": tokens, "stream": True}
    with httpx.stream("POST", url + CHAT, json=body, timeout=60) as response:
        return response.status_code, [x for x in response.iter_lines() if x.startswith("data:")]


def held(url: str) -> httpx.Response:
    return httpx.post(url + CHAT, json={"model": "sleepy", "messages": MESSAGES}, timeout=60)


@pytest.mark.parametrize("process", [("--shutdown-grace-seconds", "30")], indirect=True)
def test_sigterm_lets_the_stream_and_the_held_request_finish_then_exits_0(
    cluster: Cluster, process: GatewayProcess
) -> None:
    url = process.url
    keep_alive = httpx.Client(base_url=url, timeout=5)
    assert keep_alive.get("/readyz").status_code == 200
    with ThreadPoolExecutor(2) as pool:
        streaming = pool.submit(stream, url, "chat", 60)  # about three seconds of tokens
        waiting = pool.submit(held, url)
        chat, sleepy = cluster.engines["chat-0"], cluster.engines["sleepy-0"]
        wait_for("the stream under way", lambda: chat.running == 1)
        wait_for("a wake asked for", lambda: cluster.model("sleepy")["metadata"].get("annotations"))
        process.proc.send_signal(signal.SIGTERM)

        # Not ready any more, and no new connections; the kept-alive one still answers.
        wait_for("not ready", lambda: keep_alive.get("/readyz").status_code == 503)
        wait_for("new connections refused", process.refuses_connections)
        # The operator's part: the model wakes; the held request goes through.
        set_label(cluster, "sleepy-0", "awake")
        write_status(cluster, "sleepy", model_name="sleepy", pods={"sleepy-0": "awake"})
        answer = waiting.result(30)
        code, events = streaming.result(30)
    assert answer.status_code == 200, answer.text
    assert sleepy.requests_served == 1
    assert code == 200 and events[-1] == "data: [DONE]"
    assert chat.requests_served == 1
    assert process.proc.wait(30) == 0
    keep_alive.close()


@pytest.mark.parametrize(
    "process", [("--shutdown-grace-seconds", "30", "--keepalive-seconds", "30")], indirect=True
)
def test_a_request_on_a_kept_connection_while_draining_is_refused_and_counted(
    cluster: Cluster, process: GatewayProcess
) -> None:
    kept = httpx.Client(base_url=process.url, timeout=5)
    assert kept.get("/healthz").status_code == 200  # a connection opened before the drain
    with ThreadPoolExecutor(1) as pool:
        streaming = pool.submit(stream, process.url, "chat", 60)  # keeps the drain going
        wait_for("the stream under way", lambda: cluster.engines["chat-0"].running == 1)
        process.proc.send_signal(signal.SIGTERM)
        wait_for("new connections refused", process.refuses_connections)

        refused = kept.post(CHAT, json={"model": "chat", "messages": MESSAGES})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "shutting_down"
        assert refused.headers["Retry-After"] == "1"
        page = httpx.get(process.metrics_url, timeout=5).text
        code, events = streaming.result(30)
    counted = 'snooze_gateway_rejected_requests_total{model="",namespace="",reason="shutting_down"}'
    assert f"{counted} 1.0" in page, [line for line in page.splitlines() if counted in line]
    assert cluster.engines["chat-0"].requests_served == 1  # the refused one never reached it
    assert code == 200 and events[-1] == "data: [DONE]"
    assert process.proc.wait(30) == 0
    kept.close()


@pytest.mark.parametrize("process", [("--shutdown-grace-seconds", "1")], indirect=True)
def test_past_the_grace_period_held_requests_get_503_and_it_exits_0(
    cluster: Cluster, process: GatewayProcess
) -> None:
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(held, process.url)
        wait_for("a wake asked for", lambda: cluster.model("sleepy")["metadata"].get("annotations"))
        process.proc.send_signal(signal.SIGTERM)
        answer = waiting.result(30)
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "shutting_down"
    assert answer.headers["Retry-After"] == "1"  # another replica answers at once
    assert process.proc.wait(30) == 0
    output = process.proc.stdout.read() if process.proc.stdout else ""
    assert "Traceback" not in output, output
