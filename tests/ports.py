"""Ports for the servers a test starts in another process, chosen where nothing else on the
machine will take them between the choice and the server's own bind."""

from __future__ import annotations

import contextlib
import fcntl
import random
import socket
from collections.abc import Iterator
from pathlib import Path

# Why not bind port 0 and hand the number on: the kernel gives that port back to the next
# bind(0) of any process, and to outgoing connections, which on a busy test machine happens
# within the second a server needs to start (CI once saw "the port is in use" that way).
# Ports below the kernel's ephemeral range are never given out by it, so only another
# explicit choice could collide: this process remembers its own, and the others pick at random.
LOWEST = 20000
_given: set[int] = set()


def ephemeral_start() -> int:
    """The lowest port the kernel hands out by itself (Linux's default when unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at `host` now, below the ephemeral range, not given before."""
    candidates = list(range(LOWEST, max(ephemeral_start(), LOWEST + 1000)))
    random.shuffle(candidates)
    port = first_free(host, candidates)
    _given.add(port)
    return port


def first_free(host: str, candidates: list[int]) -> int:
    """The first of `candidates` that this process has not given and `host` can bind now."""
    for port in candidates:
        if port in _given:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port on {host} among {len(candidates)} candidates")


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` different free ports."""
    return [free_port(host) for _ in range(count)]


# Commands run as the docs print them listen where the docs say (the demo's gateway on 8080,
# the walkthrough's API server on 6443): two runs side by side take turns at them, holding one
# lock file every run on the machine opens (/tmp, whatever TMPDIR a run has).
PRINTED_ADDRESSES = Path("/tmp/snooze-tests-printed-addresses.lock")


@contextlib.contextmanager
def printed_addresses() -> Iterator[None]:
    """Hold the machine's turn at the addresses the docs print, waiting for another run's."""
    with PRINTED_ADDRESSES.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
