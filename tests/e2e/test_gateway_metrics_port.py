"""The gateway's metrics port attacked from outside: hundreds of idle connections, and clients
that trickle their request, to a real `snooze gateway --metrics-port` process. They hold a
bounded number of its threads (read from /proc), are closed after the head timeout, and never
lock the scraper or the operator out."""

from __future__ import annotations

import contextlib
import re
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Cluster, wait_for
from processes import Process, free_port

from snooze.gateway.metrics_connections import HEAD_TIMEOUT, MOST_CONNECTIONS

IDLE = 400
# Threads the gateway may start meanwhile for other work: its event loop's executor, where
# the API server's address is resolved (at most min(32, CPUs + 4) threads, 6 on 2 cores).
SLACK = 6


class MetricsPort:
    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.process = Process(
            tmp_path / "gateway.log",
            "gateway",
            "--host", "127.0.0.1",
            "--port", str(free_port()),
            "--metrics-port", str(self.port),
        )  # fmt: skip

    @property
    def threads(self) -> int:
        status = Path(f"/proc/{self.process.popen.pid}/status").read_text()
        match = re.search(r"^Threads:\s+(\d+)$", status, re.M)
        assert match, status
        return int(match.group(1))

    def get(self, path: str, **params: str) -> httpx.Response:
        return httpx.get(f"http://127.0.0.1:{self.port}{path}", params=params, timeout=10)

    def scrape(self) -> str:
        try:
            return self.get("/metrics").text
        except httpx.HTTPError:
            return ""

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)


@pytest.fixture
def metrics_port(cluster: Cluster, tmp_path: Path) -> Iterator[MetricsPort]:
    port = MetricsPort(tmp_path)
    try:
        wait_for("the metrics port", port.scrape, timeout=30)
        yield port
    finally:
        assert port.process.stop() == 0, port.process.output()[-3000:]


def closed_by_the_server(sock: socket.socket) -> bool:
    """Whether the server ended the connection (end of stream or reset); never blocks."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_idle_connections_are_closed_and_their_threads_end(metrics_port: MetricsPort) -> None:
    baseline = metrics_port.threads
    with contextlib.ExitStack() as stack:
        idle, peak = [], baseline
        for _ in range(IDLE):
            idle.append(stack.enter_context(metrics_port.connect()))
            peak = max(peak, metrics_port.threads)
        # A thread per connection, at most MOST_CONNECTIONS of them, not one per connection;
        # the newest is held until its head timeout.
        assert peak <= baseline + MOST_CONNECTIONS + SLACK, (baseline, peak)
        assert not closed_by_the_server(idle[-1])

        # The scraper and the operator still get their answers: each new connection takes the
        # place of the idle one that has waited longest.
        assert "snooze_gateway_build_info" in metrics_port.scrape()
        answer = metrics_port.get("/idle", after="0", timeout="0")
        assert (answer.status_code, answer.text) == (200, "0\n")

        wait_for(
            "every idle connection closed by the gateway",
            lambda: all(closed_by_the_server(sock) for sock in idle),
            timeout=HEAD_TIMEOUT + 20,
        )
    wait_for(
        "the gateway's threads back to what they were",
        lambda: metrics_port.threads <= baseline + SLACK,
        timeout=15,
    )


def test_a_request_trickled_a_byte_at_a_time_is_cut_at_the_head_timeout(
    metrics_port: MetricsPort,
) -> None:
    """A client that keeps sending, one byte every so often, never completes its request: the
    per-read timeout alone would never end it."""
    request = b"GET /metrics HTTP/1.1\r\nHost: gateway\r\nX-Padding: " + b"a" * 200
    with metrics_port.connect() as sock:
        started = time.monotonic()
        sent = 0
        with contextlib.suppress(OSError):  # a reset once the gateway has closed it
            while sent < len(request) and not closed_by_the_server(sock):
                sock.sendall(request[sent : sent + 1])
                sent += 1
                time.sleep(0.2)
        elapsed = time.monotonic() - started
        assert sent < len(request), "the gateway waited for the whole trickle"
        wait_for("the connection closed", lambda: closed_by_the_server(sock), timeout=10)
    # Cut after the head timeout (the trickle kept each read well within its own timeout).
    assert elapsed >= HEAD_TIMEOUT - 0.5, elapsed
    assert "snooze_gateway_build_info" in metrics_port.scrape()
