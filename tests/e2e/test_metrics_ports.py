"""The ports the cluster's machinery calls, attacked from outside: hundreds of idle connections,
and clients that trickle their request, to the metrics port of a real `snooze gateway` process
and to the metrics and liveness ports of a real `snooze operator` process (snooze/metricsport
serves all three). They hold a bounded number of the process's threads and file descriptors
(read from /proc), are closed after the head timeout, and never lock the scraper, the operator
or the kubelet out."""

from __future__ import annotations

import contextlib
import re
import select
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from ports import free_port
from processes import Process
from waits import wait_for

from snooze.metricsport.connections import HEAD_TIMEOUT, MOST_CLOSING, MOST_CONNECTIONS

from .conftest import Cluster

IDLE = 400
# Threads the process may start meanwhile for other work: its event loop's executor, where
# the API server's address is resolved (at most min(32, CPUs + 4) threads, 6 on 2 cores).
SLACK = 6
# File descriptors the process may open meanwhile for other work (its connections to the API
# server), and the one connection accepted while it waits for room.
DESCRIPTOR_SLACK = 16
# A model with no pods: the processes watch it, and the operator writes its status.
MODEL = "chat"


@dataclass(frozen=True)
class Endpoint:
    """Where a port answers, and what its answer must say."""

    port: int
    path: str
    answered: Callable[[httpx.Response], bool]


class Served:
    """A `snooze` process and its endpoints, one of which is attacked; `settled` tells when it
    has its watches of the API up (its connections open), so that it opens no more meanwhile."""

    def __init__(
        self, log: Path, endpoints: dict[str, Endpoint], settled: Callable[[], bool], *args: str
    ) -> None:
        self.endpoints = endpoints
        self.settled = settled
        self.process = Process(log, *args)

    def _status(self, field: str) -> int:
        status = Path(f"/proc/{self.process.popen.pid}/status").read_text()
        match = re.search(rf"^{field}:\s+(\d+)$", status, re.M)
        assert match, status
        return int(match.group(1))

    @property
    def threads(self) -> int:
        return self._status("Threads")

    @property
    def descriptors(self) -> int:
        return len(list(Path(f"/proc/{self.process.popen.pid}/fd").iterdir()))

    def answers(self, name: str) -> bool:
        endpoint = self.endpoints[name]
        try:
            response = httpx.get(f"http://127.0.0.1:{endpoint.port}{endpoint.path}", timeout=10)
        except httpx.HTTPError:
            return False
        return endpoint.answered(response)

    def unanswered(self) -> list[str]:
        return [name for name in self.endpoints if not self.answers(name)]

    def connect(self, name: str) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.endpoints[name].port), timeout=10)


def page(metric: str) -> Callable[[httpx.Response], bool]:
    return lambda response: response.status_code == 200 and metric in response.text


def gateway(log: Path, cluster: Cluster) -> Served:
    api, metrics = free_port(), free_port()
    endpoints = {
        "metrics": Endpoint(metrics, "/metrics", page("snooze_gateway_build_info")),
        # Where the operator waits for an engine to go idle, on the same port.
        "idle": Endpoint(
            metrics,
            "/idle?after=0&timeout=0",
            lambda response: (response.status_code, response.text) == (200, "0\n"),
        ),
    }

    def settled() -> bool:  # it has listed the models and pods
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"http://127.0.0.1:{api}/readyz").status_code == 200
        return False

    return Served(
        log,
        endpoints,
        settled,
        "gateway",
        "--host", "127.0.0.1",
        "--port", str(api),
        "--metrics-port", str(metrics),
    )  # fmt: skip


def operator(log: Path, cluster: Cluster) -> Served:
    metrics, liveness = free_port(), free_port()
    endpoints = {
        "metrics": Endpoint(metrics, "/metrics", page("snooze_operator_build_info")),
        "liveness": Endpoint(
            liveness,
            "/healthz",
            lambda response: (response.status_code, response.text) == (200, "ok\n"),
        ),
    }

    def settled() -> bool:  # it has written the model's status
        return bool(cluster.status(MODEL).get("phase"))

    return Served(
        log,
        endpoints,
        settled,
        "operator",
        "--metrics-port", str(metrics),
        "--liveness-port", str(liveness),
    )  # fmt: skip


@pytest.fixture(
    params=[("gateway", "metrics"), ("operator", "metrics"), ("operator", "liveness")],
    ids=["gateway-metrics", "operator-metrics", "operator-liveness"],
)
def attacked(
    request: pytest.FixtureRequest, cluster: Cluster, tmp_path: Path
) -> Iterator[tuple[Served, str]]:
    """A process started against the sandbox, once it has settled and every endpoint of it
    answers, and the name of the endpoint whose port the test attacks."""
    command, name = request.param
    cluster.create_model(MODEL, {"selector": {"matchLabels": {"app": MODEL}}})
    served = {"gateway": gateway, "operator": operator}[command](
        tmp_path / f"{command}.log", cluster
    )
    try:
        wait_for("the process settled", served.settled, timeout=30)
        wait_for("every endpoint answering", lambda: not served.unanswered(), timeout=30)
        yield served, name
    finally:
        assert served.process.stop() == 0, served.process.output()[-3000:]


def closed_by_the_server(sock: socket.socket) -> bool:
    """Whether the server ended the connection (end of stream or reset); never blocks."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_idle_connections_are_closed_and_their_threads_end(
    attacked: tuple[Served, str],
) -> None:
    served, name = attacked
    threads, descriptors = served.threads, served.descriptors
    with contextlib.ExitStack() as stack:
        idle, most_threads, most_descriptors = [], threads, descriptors
        for _ in range(IDLE):
            idle.append(stack.enter_context(served.connect(name)))
            most_threads = max(most_threads, served.threads)
            most_descriptors = max(most_descriptors, served.descriptors)
        # A thread and a descriptor per connection, at most MOST_CONNECTIONS of them (and the
        # replaced ones whose threads are ending), not one per connection; the newest is held
        # until its head timeout.
        assert most_threads <= threads + MOST_CONNECTIONS + MOST_CLOSING + SLACK, (
            threads,
            most_threads,
        )
        assert (
            most_descriptors <= descriptors + MOST_CONNECTIONS + MOST_CLOSING + DESCRIPTOR_SLACK
        ), (
            descriptors,
            most_descriptors,
        )
        assert not closed_by_the_server(idle[-1])

        # The scraper, the operator and the kubelet still get their answers: each new
        # connection takes the place of the idle one that has waited longest. Waited for,
        # not asked once: by design a new connection is refused while MOST_CLOSING shed
        # connections' threads have not ended yet (connections.py), and on a loaded machine
        # those threads may wait for the process's GIL past the flood's last connection; a
        # scraper's next try gets its answer. While the idle ones are held open, nothing
        # else frees a place, so an answer here is still one made by shedding them.
        wait_for("every endpoint answering", lambda: served.unanswered() == [], timeout=60)

        wait_for(
            "every idle connection closed by the server",
            lambda: all(closed_by_the_server(sock) for sock in idle),
            timeout=HEAD_TIMEOUT + 20,
        )
    wait_for(
        "the process's threads back to what they were",
        lambda: served.threads <= threads + SLACK,
        timeout=15,
    )
    assert served.descriptors <= descriptors + DESCRIPTOR_SLACK


def test_a_request_trickled_a_byte_at_a_time_is_cut_at_the_head_timeout(
    attacked: tuple[Served, str],
) -> None:
    """A client that keeps sending, one byte every so often, never completes its request: the
    per-read timeout alone would never end it."""
    served, name = attacked
    path = served.endpoints[name].path.encode()
    request = b"GET " + path + b" HTTP/1.1\r\nHost: snooze\r\nX-Padding: " + b"a" * 200
    with served.connect(name) as sock:
        started = time.monotonic()
        sent = 0
        with contextlib.suppress(OSError):  # a reset once the server has closed it
            while sent < len(request) and not closed_by_the_server(sock):
                sock.sendall(request[sent : sent + 1])
                sent += 1
                time.sleep(0.2)
        elapsed = time.monotonic() - started
        assert sent < len(request), "the server waited for the whole trickle"
        wait_for("the connection closed", lambda: closed_by_the_server(sock), timeout=10)
    # Cut after the head timeout (the trickle kept each read well within its own timeout).
    assert elapsed >= HEAD_TIMEOUT - 0.5, elapsed
    assert served.unanswered() == []


# A flood beyond the port's room, and its control: as many connections as fit without
# replacing any.
FLOOD = 300
CONTROL = MOST_CONNECTIONS - 8
# How long the flood's excess may take to be shed: the port takes a connection in about a
# millisecond; before, most of the flood waited on the kernel's retries of connections its
# accept queue had dropped (1, 3, 7, 15 and 31 s after the first try).
SHED_SECONDS = 3.0


def flood(served: Served, name: str, count: int) -> list[socket.socket]:
    """`count` connections that will send nothing, all begun at once (not one waiting for the
    last to be accepted), as an attacker opens them."""
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", served.endpoints[name].port))
        sockets.append(sock)
    return sockets


SYN_RETRY_SECONDS = 1.0
"""Linux's initial retransmission timeout (TCP_TIMEOUT_INIT): a connection that the accept
queue dropped is answered no sooner than this."""


def timed_answer(served: Served, name: str) -> float:
    began = time.monotonic()
    assert served.answers(name)
    return time.monotonic() - began


def test_a_flood_of_idle_connections_is_shed_at_once(attacked: tuple[Served, str]) -> None:
    """Past its room, each new connection takes the place of the idle one that has waited
    longest at once, without waiting for that one's thread to end, and the port's accept
    queue holds a flood rather than dropping it for the kernel to retry seconds later: the
    flood's older connections are closed as it comes, and a scrape right after it is answered
    about as promptly as one after a few idle connections."""
    served, name = attacked
    with contextlib.ExitStack() as stack:
        for sock in flood(served, name, CONTROL):
            stack.enter_context(sock)
        control = timed_answer(served, name)
    with contextlib.ExitStack() as stack:
        began = time.monotonic()
        sockets = flood(served, name, FLOOD)
        for sock in sockets:
            stack.enter_context(sock)
        answer = timed_answer(served, name)
        excess = FLOOD - MOST_CONNECTIONS
        shed = 0
        while shed < excess and time.monotonic() < began + SHED_SECONDS:
            time.sleep(0.02)
            shed = sum(closed_by_the_server(sock) for sock in sockets)
        shed_seconds = time.monotonic() - began
    figures = {"answer_ratio": answer / control, "shed": shed, "shed_seconds": shed_seconds}
    assert shed >= excess, figures
    # The scrape is held behind the flood only as long as the port takes to go through it
    # (about a millisecond a connection): a few times the control, not the kernel's retries.
    # One scrape of a few milliseconds is a noisy control on a loaded machine (10.1 times was
    # seen in a full run, the flood shed in 0.37 s), so the ratio fails the test only where the
    # answer also took as long as a dropped connection costs: the kernel's first SYN
    # retransmission, a second after the first try.
    assert figures["answer_ratio"] < 10 or answer < SYN_RETRY_SECONDS, figures
