"""A watch client that leaves (as `kubectl wait` does once its condition holds) is let go
quietly: the sandbox's terminal shows no traceback when the next change finds it gone."""

from __future__ import annotations

import logging
import socket
import struct
import time

import httpx
import pytest
from builders import pod
from waits import wait_for

from snooze.sandbox import Sandbox

PODS = "/api/v1/namespaces/default/pods"


def watch(client: socket.socket) -> None:
    """Open a watch of the pods on a connected socket; return once it has begun."""
    client.sendall(f"GET {PODS}?watch=true HTTP/1.1\r\nHost: sandbox\r\n\r\n".encode())
    assert client.recv(4096).startswith(b"HTTP/1.1 200")


def let_go_quietly(watchers: set[object], before: int, caplog: pytest.LogCaptureFixture) -> None:
    """The sandbox drops the watch, and logs no warning or error on the way."""
    wait_for("the watch to notice its client left", lambda: len(watchers) <= before, 30)
    assert len(watchers) == before
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert errors == [], [r.getMessage() for r in errors]


def test_a_watch_whose_client_left_ends_without_an_error(
    sandbox: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    watchers = sandbox.emulator.watches._watchers
    before = len(watchers)
    with socket.create_connection((sandbox.host, sandbox.port)) as client:
        watch(client)
        assert len(watchers) == before + 1
    # The client is gone; the next change is the sandbox's first write to its connection.
    with httpx.Client(base_url=sandbox.url) as http:
        for n in range(3):
            http.post(PODS, json=pod(name=f"left-{n}")).raise_for_status()
    let_go_quietly(watchers, before, caplog)


def test_a_watch_whose_client_reset_a_full_connection_ends_without_an_error(
    sandbox: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    # A client that stops reading (a busy process) and is then killed: the sandbox is waiting
    # for room to write when the connection is reset, which aiohttp reports as a plain
    # ConnectionError("Connection lost"), not a ConnectionResetError.
    caplog.set_level(logging.INFO)
    watchers = sandbox.emulator.watches._watchers
    before = len(watchers)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect((sandbox.host, sandbox.port))
    watch(client)
    big = "x" * 200_000
    with httpx.Client(base_url=sandbox.url) as http:
        for n in range(40):  # 8 MB of events the client never reads
            body = pod(name=f"full-{n}")
            body["metadata"] = {"name": f"full-{n}", "annotations": {"big": big}}
            http.post(PODS, json=body).raise_for_status()
        # A sleep, not a wait: nothing tells when the sandbox's send buffers are full; half a second
        # of writes fills them.
        time.sleep(0.5)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset, with the sandbox's writes still waiting
        http.post(PODS, json=pod(name="after-reset")).raise_for_status()
    let_go_quietly(watchers, before, caplog)
