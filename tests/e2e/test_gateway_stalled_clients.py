"""A client that reads nothing of its answer is cut after --client-read-timeout, and its
request ends: it no longer counts as in flight on the gateway's page, which is how the
operator knows a model is busy, so the model sleeps after its idle time and its GPU pool may
put it to sleep for another member. The client is a real socket whose receive buffer is 4 KiB
and which never reads; the gateway is a `snooze gateway` process, the operator reads its
page as the chart has it do, and the controls of the same run are clients that do read."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from processes import GatewayProcess, running_gateway
from stand_in import write_status
from waits import wait_for

from snooze.sandbox import Sandbox
from snooze.sim import SimulatedEngine

from .conftest import FAST, Cluster, OperatorThread
from .test_gateway import MESSAGES
from .test_pool_queue import member_spec
from .test_pools import device_and_pool

READ_TIMEOUT = 1.0
TOKEN_SECONDS = 0.0005
LONG = 100_000
"""Tokens of a stream that lasts (its client leaves, or is cut, long before its end)."""


@pytest.fixture
def gateway(sandbox: Sandbox, tmp_path: Path) -> Iterator[GatewayProcess]:
    with running_gateway(
        tmp_path / "gateway.log", "--client-read-timeout", f"{READ_TIMEOUT}s"
    ) as process:
        yield process


def unread_stream(gateway: GatewayProcess, model: str) -> socket.socket:
    """A streaming request for `model` from a socket whose receive buffer is small, which
    will read nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before the handshake
    sock.connect(("127.0.0.1", gateway.port))
    body = json.dumps(
        {"model": model, "messages": MESSAGES, "max_tokens": LONG, "stream": True}
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


def drained_to_its_end(sock: socket.socket, within: float = 5.0) -> bool:
    """Whether the gateway closed the connection: what it had sent, then its end."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def awake_model(cluster: Cluster, name: str, **engine: Any) -> SimulatedEngine:
    """A model of one pod, awake, with the status the operator would write."""
    sim = cluster.create_pod(
        f"{name}-0", labels={"app": name, "snooze.dev/state": "awake"}, model=name, **engine
    )
    cluster.create_model(name, {"selector": {"matchLabels": {"app": name}}})
    write_status(cluster, name, model_name=name, pods={f"{name}-0": "awake"})
    return sim


def test_a_stream_nobody_reads_is_cut_and_no_longer_in_flight(
    cluster: Cluster, gateway: GatewayProcess
) -> None:
    engine = awake_model(cluster, "long", token_seconds=TOKEN_SECONDS)
    wait_for("routable", lambda: gateway.routable("long"))
    with unread_stream(gateway, "long") as sock:
        wait_for("the engine streaming", lambda: engine.running == 1)
        assert gateway.in_flight("long-0") == 1
        wait_for("the request no longer in flight", lambda: gateway.in_flight("long-0") == 0)
        wait_for("the engine's request ended", lambda: engine.running == 0)
        assert drained_to_its_end(sock), "the gateway did not close the connection"
    assert gateway.sample("snooze_gateway_rejected_requests_total", reason="client_stalled") == 1


def test_a_slow_reader_is_not_cut(cluster: Cluster, gateway: GatewayProcess) -> None:
    """The control: a client that takes its stream slowly (about 10 kB/s, far below what the
    engine sends) but steadily keeps it for several read timeouts."""
    engine = awake_model(cluster, "long", token_seconds=TOKEN_SECONDS)
    wait_for("routable", lambda: gateway.routable("long"))
    with unread_stream(gateway, "long") as sock:
        wait_for("the engine streaming", lambda: engine.running == 1)
        sock.settimeout(2.0)
        taken = 0
        until = time.monotonic() + 5 * READ_TIMEOUT
        while time.monotonic() < until:
            data = sock.recv(512)
            assert data, f"cut after {taken} bytes"
            taken += len(data)
            time.sleep(0.05)
        assert gateway.in_flight("long-0") == 1
    wait_for("the request over once its client left", lambda: gateway.in_flight("long-0") == 0)
    assert gateway.sample("snooze_gateway_rejected_requests_total", reason="client_stalled") == 0


@pytest.fixture
def operator(gateway: GatewayProcess) -> Iterator[OperatorThread]:
    """The operator, reading the gateway's page (its per-engine traffic) as the chart has it."""
    thread = OperatorThread(replace(FAST, gateway_metrics=(gateway.metrics,))).start()
    yield thread
    thread.stop()


def reading_stream(gateway: GatewayProcess, model: str, seconds: float) -> None:
    """The control's client: takes its stream for `seconds`, then leaves."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": LONG, "stream": True}
    url = gateway.url + "/v1/chat/completions"
    until = time.monotonic() + seconds
    with httpx.stream("POST", url, json=body, timeout=30) as answer:
        for _ in answer.iter_raw():
            if time.monotonic() >= until:
                return


def test_a_model_whose_stream_nobody_reads_sleeps_as_the_control_does(
    cluster: Cluster, gateway: GatewayProcess, operator: OperatorThread
) -> None:
    """Two models that sleep after a second idle: one's client reads its stream for a second
    and leaves (the control), the other's never reads. Each sleeps, counted from its stream's
    start: the unread one after about the read timeout and its idle time, as the control
    does after its second of reading and its idle time (before: never, for as long as its
    client kept the connection open)."""
    engines = {}
    for name in ("control", "unread"):
        engines[name] = cluster.create_pod(f"{name}-0", labels={"app": name}, model=name,
                                           token_seconds=TOKEN_SECONDS)  # fmt: skip
        spec = {"selector": {"matchLabels": {"app": name}}, "idle": {"after": "1s"}}
        cluster.create_model(name, spec)

    def asleep_after_stream(name: str, client: Callable[[], object]) -> float:
        """Seconds from the engine's stream beginning (the request wakes the model if it
        already slept) to the model asleep."""
        wait_for(f"{name} served", lambda: cluster.pod_state(f"{name}-0"), timeout=30)
        with ThreadPoolExecutor(1) as pool:
            asked = pool.submit(client)
            wait_for(f"{name} streaming", lambda: engines[name].running == 1, timeout=30)
            began = time.monotonic()
            wait_for(f"{name} asleep", lambda: cluster.pod_state(f"{name}-0") == "asleep",
                     timeout=30)  # fmt: skip
            slept = time.monotonic() - began
            asked.result()
        return slept

    control = asleep_after_stream("control", lambda: reading_stream(gateway, "control", 1.0))
    with contextlib.ExitStack() as open_:
        unread = asleep_after_stream(
            "unread", lambda: open_.enter_context(unread_stream(gateway, "unread"))
        )
    assert unread < 3 * control, {"control_s": control, "unread_s": unread}


def test_a_pool_member_whose_stream_nobody_reads_makes_room(
    cluster: Cluster, gateway: GatewayProcess, operator: OperatorThread
) -> None:
    """Two 40 GiB members on a 70 GiB device: `busy` is awake, streaming to a client that
    never reads; `other` sleeps, and a request for it needs busy's room. The pool never puts
    a member with requests in flight to sleep: once the gateway has cut the stalled client,
    busy sleeps and other wakes, and its request is served within its wake timeout (before:
    504, as long as the socket stayed open)."""
    device = device_and_pool(cluster)
    cluster.create_model("busy", member_spec("busy", "40Gi"))
    cluster.create_model("other", member_spec("other", "40Gi"))
    device.start("other", gpu_memory_gib=20, kv_cache_gib=19)
    device.start("busy", gpu_memory_gib=20, kv_cache_gib=19, token_seconds=TOKEN_SECONDS)
    engines = device.engines
    wait_for("other asleep, busy awake", lambda: engines["other"].is_sleeping
             and gateway.routable("busy"), timeout=30)  # fmt: skip
    with unread_stream(gateway, "busy"):
        wait_for("busy streaming", lambda: engines["busy"].running == 1)
        answer = ask(gateway, "other")
    # Within other's wake timeout (member_spec's), or it would be 504.
    assert answer.status_code == 200, answer.text
    assert engines["busy"].is_sleeping and not engines["other"].is_sleeping


def ask(gateway: GatewayProcess, model: str) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 2}
    with contextlib.suppress(httpx.ReadTimeout):
        return httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)
    raise AssertionError(f"no answer for {model} within 30 s")
