"""The tests' port chooser: ports below the kernel's ephemeral range, free, never twice."""

from __future__ import annotations

import socket

from ports import LOWEST, ephemeral_start, first_free, free_port, free_ports


def test_ports_are_below_the_ephemeral_range_and_differ() -> None:
    chosen = free_ports(50)
    assert len(set(chosen)) == 50
    assert all(20000 <= port < ephemeral_start() for port in chosen)


def test_a_port_something_listens_on_is_skipped() -> None:
    with socket.socket() as taken, socket.socket() as released:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        released.bind(("127.0.0.1", 0))
        free = released.getsockname()[1]
        released.close()
        assert first_free("127.0.0.1", [taken.getsockname()[1], free]) == free


def test_a_port_given_before_is_skipped() -> None:
    given = free_port()
    assert first_free("127.0.0.1", [given, *range(LOWEST, LOWEST + 100)]) != given
