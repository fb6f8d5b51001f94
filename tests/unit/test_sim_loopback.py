"""Loopback octets claimed per process: what lets test and benchmark runs share a machine."""

from __future__ import annotations

import socket

import pytest

from snooze.sim.loopback import claim_octet


def test_a_claimed_octet_is_not_claimed_again_while_its_socket_is_open() -> None:
    octets = range(250, 253)
    first, held = claim_octet(octets)
    try:
        second, other = claim_octet(octets)
        other.close()
        assert second != first and {first, second} <= set(octets)
    finally:
        held.close()
    # Closed (as when its process ends), it may be claimed again.
    again, claim = claim_octet(range(first, first + 1))
    claim.close()
    assert again == first


def test_a_range_every_octet_of_which_is_claimed_says_so() -> None:
    octet, held = claim_octet(range(253, 254))
    try:
        with pytest.raises(RuntimeError, match=r"from 127\.253 to 127\.253 is claimed"):
            claim_octet(range(253, 254))
        # The claim is a listening socket on an address no engine takes.
        with socket.create_connection((f"127.{octet}.255.254", 19999), timeout=2):
            pass
    finally:
        held.close()
