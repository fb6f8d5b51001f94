"""A port's bookkeeping of connections (metricsport/connections.py), on real socket pairs
and a clock the test moves: who is admitted, who makes room, who is closed when."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from snooze.metricsport.connections import Connections


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pairs() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    """(server side, client side) socket pairs, closed after the test."""
    made: list[tuple[socket.socket, socket.socket]] = []
    yield made
    for server, client in made:
        server.close()
        client.close()


def closed(client: socket.socket) -> bool:
    """Whether the server side was shut down: the client reads the end of the stream."""
    client.setblocking(False)
    try:
        return client.recv(1) == b""
    except BlockingIOError:
        return False


def connect(made: list[tuple[socket.socket, socket.socket]]) -> tuple[socket.socket, socket.socket]:
    pair = socket.socketpair()
    made.append(pair)
    return pair


def test_a_full_port_replaces_the_longest_waiting_connection_at_once(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    """The oldest connection still waiting for its request is shut down, and the new one is
    admitted at once, without waiting for the closed one's thread: that one stays listed,
    as closing, until its thread ends."""
    clock = Clock()
    connections = Connections(most=3, head_timeout=5, lifetime=45, clock=clock)
    first, second, third = (connect(pairs) for _ in range(3))
    for server, _ in (first, second, third):
        assert connections.admit(server)
        clock.now += 1
    connections.answering(first[0])  # its request is in: it is being answered, never replaced
    newcomer = connect(pairs)
    assert connections.admit(newcomer[0])
    assert closed(second[1])
    assert len(connections) == 4  # the closed one's thread has not ended yet
    connections.release(second[0])  # as its thread does when it ends
    assert len(connections) == 3
    assert not closed(first[1]) and not closed(third[1]) and not closed(newcomer[1])


def test_threads_still_ending_are_bounded(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    """A flood faster than replaced connections' threads end is refused past `most_closing`
    of them (once it has waited `closing_wait` for one to end), and admitted again as they
    end."""
    connections = Connections(
        most=2, most_closing=2, head_timeout=5, lifetime=45, closing_wait=0.05
    )
    idle = [connect(pairs) for _ in range(2)]
    for server, _ in idle:
        assert connections.admit(server)
    flood = [connect(pairs) for _ in range(3)]
    assert connections.admit(flood[0][0]) and connections.admit(flood[1][0])
    assert all(closed(client) for _, client in idle)
    assert not connections.admit(flood[2][0]), "two threads are still ending"
    connections.release(idle[0][0])
    assert connections.admit(flood[2][0])
    assert closed(flood[0][1]) and not closed(flood[2][1])
    assert connections.closed_early == 4  # three replaced, one refused


def test_past_the_closing_bound_a_connection_waits_for_a_thread_to_end(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    """On a busy machine shut-down threads end late: the connection that comes then (the
    scrape after a flood) waits for one of them, and is admitted, not refused."""
    connections = Connections(most=1, most_closing=1, head_timeout=5, lifetime=45, closing_wait=30)
    idle = connect(pairs)
    assert connections.admit(idle[0])
    flood = connect(pairs)
    assert connections.admit(flood[0])  # the idle one is shut down; its thread is ending
    scrape = connect(pairs)
    ending = threading.Timer(0.2, connections.release, [idle[0]])  # as its thread ends
    ending.start()
    began = time.monotonic()
    assert connections.admit(scrape[0])
    waited = time.monotonic() - began
    ending.join()
    assert waited >= 0.1, "admitted before the ending thread released its connection"
    assert closed(flood[1]) and not closed(scrape[1])


def test_a_port_whose_connections_are_all_answered_refuses_a_new_one(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    connections = Connections(most=2, head_timeout=5, lifetime=45)
    admitted = [connect(pairs) for _ in range(2)]
    for server, _ in admitted:
        assert connections.admit(server)
        connections.answering(server)
    assert not connections.admit(connect(pairs)[0])
    assert not any(closed(client) for _, client in admitted)
    assert connections.closed_early == 1


def test_deadlines_the_head_timeout_then_the_lifetime(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    clock = Clock()
    connections = Connections(most=8, head_timeout=5, lifetime=45, clock=clock)
    silent, answered = connect(pairs), connect(pairs)
    for server, _ in (silent, answered):
        assert connections.admit(server)
    connections.answering(answered[0])
    clock.now += 4.9
    connections.reap()
    assert not closed(silent[1])
    clock.now += 0.1
    connections.reap()
    assert closed(silent[1]), "no request within the head timeout"
    assert not closed(answered[1]), "an answered connection lives until its lifetime"
    clock.now += 40
    connections.reap()
    assert closed(answered[1])
    # Listed until their threads end, and closed once.
    assert len(connections) == 2 and connections.closed_early == 2
    connections.reap()
    assert connections.closed_early == 2
    for server, _ in (silent, answered):
        connections.release(server)
    assert len(connections) == 0


def test_a_released_connection_is_never_shut_down_again(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    """Its file descriptor may belong to another connection by then."""
    clock = Clock()
    connections = Connections(most=1, head_timeout=5, lifetime=45, clock=clock)
    server, client = connect(pairs)
    assert connections.admit(server)
    connections.release(server)
    clock.now += 60
    connections.reap()
    assert not closed(client)
    assert connections.closed_early == 0
