"""Every `snooze` command that listens, run as a person runs it on a port another process holds:
one line on stderr that names the address, the flag to change and what to do, and exit code 2,
as for any other bad input; no traceback."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import SNOOZE

from snooze.sandbox import Sandbox

# (command, its arguments with PORT for the port taken, the flag that names that port, the
# address it listens on, what it serves there, whether 0 picks a free port for it)
LISTENERS = [
    ("gateway", ["--host", "127.0.0.1", "--port", "PORT"], "--port", "127.0.0.1", "its API", True),
    ("gateway", ["--port", "0", "--metrics-port", "PORT"], "--metrics-port", "0.0.0.0", "metrics",
     True),
    ("operator", ["--metrics-port", "PORT"], "--metrics-port", "0.0.0.0", "metrics", True),
    # 0 turns the liveness port off.
    ("operator", ["--liveness-port", "PORT"], "--liveness-port", "0.0.0.0", "the liveness probe",
     False),
    ("sim", ["--port", "PORT"], "--port", "127.0.0.1", "an engine", True),
    ("sandbox", ["--port", "PORT", "--kubeconfig", "OUT/kubeconfig"], "--port", "127.0.0.1",
     "its API", True),
    ("demo", ["--port", "PORT", "--out", "OUT"], "--port", "127.0.0.1", "the gateway", True),
]  # fmt: skip


@pytest.fixture
def taken() -> Iterator[int]:
    """A port that another process listens on, on every address."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.mark.parametrize(
    ("command", "args", "flag", "host", "what", "zero"),
    LISTENERS,
    ids=[f"{listener[0]} {listener[2]}" for listener in LISTENERS],
)
def test_a_port_taken_is_one_line_and_exit_2(
    sandbox: Sandbox,  # its kubeconfig in KUBECONFIG: the gateway and operator log in first
    taken: int,
    tmp_path: Path,
    command: str,
    args: list[str],
    flag: str,
    host: str,
    what: str,
    zero: bool,
) -> None:
    argv = [a.replace("PORT", str(taken)).replace("OUT", str(tmp_path)) for a in args]
    done = subprocess.run([*SNOOZE, command, *argv], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    free = " (0 picks a free one)" if zero else ""
    assert done.stderr == (
        f"snooze {command}: cannot serve {what} on {host}:{taken}: the port is in use; stop "
        f"what holds it, or give another {flag}{free}\n"
    )
