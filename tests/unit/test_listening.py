"""The one line every command prints when it cannot listen: why, where, and which flag to
change (tests/e2e/test_ports_taken.py runs each command on a port taken)."""

from __future__ import annotations

import errno
import os

import pytest

from snooze.api.listening import CannotListen, cannot_listen


def refused(code: int, host: str = "127.0.0.1", port: int = 8080) -> CannotListen:
    return CannotListen(host, port, OSError(code, os.strerror(code)))


@pytest.mark.parametrize(
    ("taken", "line"),
    [
        (
            refused(errno.EADDRINUSE),
            "cannot serve its API on 127.0.0.1:8080: the port is in use; stop what holds it, "
            "or give another --port (0 picks a free one)",
        ),
        (
            refused(errno.EADDRNOTAVAIL, host="::2"),
            "cannot serve its API on [::2]:8080: the address is not one of this machine's; "
            "give another --host",
        ),
        (
            refused(errno.EACCES, port=80),
            "cannot serve its API on 127.0.0.1:80: permission denied (ports below 1024 need "
            "privileges); give another --port (0 picks a free one)",
        ),
        (
            refused(errno.EMFILE),
            "cannot serve its API on 127.0.0.1:8080: Too many open files; give another --port "
            "(0 picks a free one)",
        ),
    ],
)
def test_the_line_says_why_and_which_flag(taken: CannotListen, line: str) -> None:
    assert cannot_listen(taken, what="its API", port_flag="--port", host_flag="--host") == line


def test_without_a_host_flag_or_a_free_port() -> None:
    """A command with no --host names its port flag; one whose 0 turns the port off says
    nothing of free ports."""
    line = cannot_listen(
        refused(errno.EADDRNOTAVAIL), what="the probe", port_flag="--probe-port", zero_picks=False
    )
    assert line.endswith("; give another --probe-port")
