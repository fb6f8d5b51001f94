"""Every wait has a bound: an engine that accepts connections but never answers (its
`snooze sim` process SIGSTOPped), and clients that trickle their request (slow loris).

The engines here are separate processes, so that stopping one freezes it as a hung vLLM
would be frozen; no operator runs, the test writes the labels and status it would
(stand_in.py).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from gateway_fixtures import GatewayThread, routable_pods, start_gateway
from stand_in import write_status
from waits import wait_for

from .conftest import Cluster, _addresses
from .test_gateway import MESSAGES

CHAT = "/v1/chat/completions"


class EngineProcess:
    """`snooze sim` in a process of its own, to freeze (SIGSTOP) and thaw (SIGCONT)."""

    def __init__(self, model: str, **options: Any) -> None:
        self.host = next(_addresses)
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
        command = [sys.executable, "-m", "snooze.cli", "sim", "--host", self.host]
        self.proc = subprocess.Popen(
            [*command, "--port", "8000", "--model", model, *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://{self.host}:8000/health"
        wait_for("the engine listening", lambda: _answers(url), timeout=30)

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def close(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def engine(cluster: Cluster) -> Iterator[EngineProcess]:
    process = EngineProcess("slow", token_seconds=0.05)
    cluster.create_pod("slow-0", labels={"app": "slow", "snooze.dev/state": "awake"})
    cluster.set_pod_ready("slow-0", process.host, ready=True)
    cluster.create_model("slow", {"selector": {"matchLabels": {"app": "slow"}}})
    write_status(cluster, "slow", model_name="slow", pods={"slow-0": "awake"})
    yield process
    process.close()


@pytest.fixture
def impatient(cluster: Cluster) -> Iterator[GatewayThread]:
    """A gateway whose upstream and client timeouts are a second long."""
    gw = start_gateway(
        upstream_first_byte_timeout=1.0,
        upstream_idle_timeout=1.0,
        client_header_timeout=1.0,
        client_body_timeout=1.0,
    )
    yield gw
    gw.stop()


def test_a_frozen_engine_gives_504_not_a_hang(
    engine: EngineProcess, impatient: GatewayThread
) -> None:
    wait_for("routable", lambda: routable_pods(impatient, "slow") == 1)
    body = {"model": "slow", "messages": MESSAGES, "max_tokens": 2}
    assert httpx.post(impatient.url + CHAT, json=body, timeout=10).status_code == 200
    engine.freeze()
    answer = httpx.post(impatient.url + CHAT, json=body, timeout=15)
    assert answer.status_code == 504
    error = answer.json()["error"]
    assert error["code"] == "upstream_timeout"
    assert "did not answer within 1" in error["message"]
    assert "--upstream-first-byte-timeout" in error["message"]


def test_an_engine_frozen_mid_stream_ends_the_stream_with_an_error_event(
    engine: EngineProcess, impatient: GatewayThread
) -> None:
    wait_for("routable", lambda: routable_pods(impatient, "slow") == 1)
    body = {"model": "slow", "messages": MESSAGES, "max_tokens": 400, "stream": True}
    events = []
    with httpx.stream("POST", impatient.url + CHAT, json=body, timeout=15) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            events.append(line)
            if len(events) == 3:
                engine.freeze()
    assert len(events) < 400
    final = json.loads(events[-1].removeprefix("data: "))
    assert final["error"]["code"] == "upstream_timeout"
    assert "--upstream-idle-timeout" in final["error"]["message"]


def test_the_idle_timeout_holds_after_a_longer_first_byte_timeout(engine: EngineProcess) -> None:
    """The idle bound is kept from the second chunk on even when the first byte's is longer
    (as by default: ten minutes, then two): the answers' one timer was left set for the first
    byte's deadline, and a stream frozen after its first chunks hung that long."""
    patient = start_gateway(upstream_first_byte_timeout=30.0, upstream_idle_timeout=1.0)
    try:
        wait_for("routable", lambda: routable_pods(patient, "slow") == 1)
        body = {"model": "slow", "messages": MESSAGES, "max_tokens": 400, "stream": True}
        began = time.monotonic()
        events = []
        with httpx.stream("POST", patient.url + CHAT, json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    events.append(line)
                    if len(events) == 3:
                        engine.freeze()
        took = time.monotonic() - began
    finally:
        patient.stop()
    final = json.loads(events[-1].removeprefix("data: "))
    assert final["error"]["code"] == "upstream_timeout"
    assert "--upstream-idle-timeout" in final["error"]["message"]
    assert took < 15, took  # the idle timeout's second (and a loaded machine), not thirty


def test_a_stream_longer_than_the_idle_timeout_but_never_idle_that_long_goes_through(
    engine: EngineProcess, impatient: GatewayThread
) -> None:
    """The idle bound is between two chunks, not on the whole answer: 60 tokens 50 ms apart
    (three seconds) pass a one-second bound whole."""
    wait_for("routable", lambda: routable_pods(impatient, "slow") == 1)
    body = {"model": "slow", "messages": MESSAGES, "max_tokens": 60, "stream": True}
    with httpx.stream("POST", impatient.url + CHAT, json=body, timeout=30) as response:
        assert response.status_code == 200
        events = [x for x in response.iter_lines() if x.startswith("data:")]
    assert events[-1] == "data: [DONE]", events[-2:]
    assert not any('"error"' in event for event in events)
    assert len(events) == 62  # 60 tokens (the first with the role), the finish, [DONE]


def slow_sockets(port: int, count: int, first: bytes) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if first:
            sock.sendall(first)
        sockets.append(sock)
    return sockets


def trickle_until_closed(sockets: list[socket.socket], byte: bytes, limit: float) -> list[bytes]:
    """Send one byte per socket every 0.2 s, as a slow-loris client does, until the gateway
    closes each one; the bytes each one received. Fails if any is still open after `limit`."""
    received = {sock: b"" for sock in sockets}
    open_ = set(sockets)
    deadline = time.monotonic() + limit
    while open_ and time.monotonic() < deadline:
        for sock in list(open_):
            try:
                sock.send(byte)
            except OSError:
                open_.discard(sock)
        readable, _, _ = select.select(list(open_), [], [], 0.2)
        for sock in readable:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            received[sock] += data
            if not data:
                open_.discard(sock)
    for sock in sockets:
        sock.close()
    assert not open_, f"{len(open_)} of {len(sockets)} slow connections still open"
    return list(received.values())


def test_slow_loris_headers_and_idle_connections_are_cut(impatient: GatewayThread) -> None:
    wait_for("ready", lambda: httpx.get(impatient.url + "/readyz").status_code == 200)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
    loris = slow_sockets(impatient.port, 55, head)
    silent = slow_sockets(impatient.port, 5, b"")
    # The gateway still serves others meanwhile.
    assert httpx.get(impatient.url + "/healthz").status_code == 200
    answers = trickle_until_closed(loris, b"X", limit=20)
    trickle_until_closed(silent, b"", limit=20)
    for answer in answers:
        if answer:  # a 408 in OpenAI's shape, when the socket could still take it
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
            assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == (
                "request_timeout"
            )
    assert any(answers)


def test_a_body_trickled_byte_by_byte_is_cut(impatient: GatewayThread) -> None:
    wait_for("ready", lambda: httpx.get(impatient.url + "/readyz").status_code == 200)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
    )
    sockets = slow_sockets(impatient.port, 10, head)
    answers = trickle_until_closed(sockets, b" ", limit=20)
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        error = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
        assert "--client-body-timeout" in error["message"]


def test_a_pod_that_does_not_take_connections_is_passed_over(
    cluster: Cluster, sandbox: Any
) -> None:
    """One pod's accept queue is full (connections hang, as to a node gone dark): after the
    connect timeout the request goes to the other pod, since nothing was sent."""
    dark = next(_addresses)
    listener = socket.socket()
    listener.bind((dark, 8000))
    listener.listen(0)
    filler = socket.create_connection((dark, 8000))  # fills the queue: the next SYNs hang
    cluster.create_pod("pair-0", labels={"app": "pair", "snooze.dev/state": "awake"})
    cluster.set_pod_ready("pair-0", dark, ready=True)
    good = cluster.create_pod(
        "pair-1", labels={"app": "pair", "snooze.dev/state": "awake"}, model="pair"
    )
    cluster.create_model("pair", {"selector": {"matchLabels": {"app": "pair"}}})
    write_status(cluster, "pair", model_name="pair", pods={"pair-0": "awake", "pair-1": "awake"})
    gw = start_gateway(connect_timeout=0.5)
    try:
        wait_for("routable", lambda: routable_pods(gw, "pair") == 2)
        body = {"model": "pair", "messages": MESSAGES, "max_tokens": 2}
        codes = [httpx.post(gw.url + CHAT, json=body, timeout=10).status_code for _ in range(4)]
        assert codes == [200] * 4
        assert good.seen["POST /v1/chat/completions"] == 4
    finally:
        gw.stop()
        filler.close()
        listener.close()
