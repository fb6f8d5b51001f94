"""A watch client that leaves (as `kubectl wait` does once its condition holds) is let go
quietly: the sandbox's terminal shows no traceback when the next change finds it gone."""

from __future__ import annotations

import logging
import socket
import time

import httpx
import pytest

from snooze.sandbox import Sandbox

PODS = "/api/v1/namespaces/default/pods"


def pod(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


def test_a_watch_whose_client_left_ends_without_an_error(
    sandbox: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    watchers = sandbox.emulator.watches._watchers
    before = len(watchers)
    with socket.create_connection((sandbox.host, sandbox.port)) as client:
        client.sendall(f"GET {PODS}?watch=true HTTP/1.1\r\nHost: sandbox\r\n\r\n".encode())
        assert client.recv(4096).startswith(b"HTTP/1.1 200")
        assert len(watchers) == before + 1
    # The client is gone; the next change is the sandbox's first write to its connection.
    with httpx.Client(base_url=sandbox.url) as http:
        for n in range(3):
            http.post(PODS, json=pod(f"left-{n}")).raise_for_status()
    deadline = time.monotonic() + 30
    while len(watchers) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(watchers) == before, "the watch never noticed its client left"
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert errors == [], [r.getMessage() for r in errors]
