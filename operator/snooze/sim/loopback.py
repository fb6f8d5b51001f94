"""Loopback addresses for simulated engines that no other process on the machine takes: a
second octet of 127.x.y.z that one process claims for as long as it lives."""

from __future__ import annotations

import os
import socket

CLAIM_PORT = 19999
"""Where a claim listens, on 127.x.255.254: an address no engine takes, at a port below those
the tests choose for their servers."""


def claim_octet(octets: range) -> tuple[int, socket.socket]:
    """One of `octets` that no other process claims now, and the socket that claims it: the
    claim holds while that socket is open (it closes with the process). Tried from the process
    id on, so that processes started together seldom try the same one first."""
    for step in range(len(octets)):
        octet = octets[(os.getpid() + step) % len(octets)]
        claim = socket.socket()
        try:
            claim.bind((f"127.{octet}.255.254", CLAIM_PORT))
            claim.listen()
        except OSError:
            claim.close()
            continue
        return octet, claim
    raise RuntimeError(
        f"every loopback octet from 127.{octets[0]} to 127.{octets[-1]} is claimed by another "
        "process: stop some of them"
    )
