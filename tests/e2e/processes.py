"""`snooze` subcommands run as a person runs them: separate processes, their output in a file."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

SNOOZE = [sys.executable, "-m", "snooze.cli"]


class Process:
    """One `snooze ...` process; its stdout and stderr go to one log file."""

    def __init__(self, log: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.log = log
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                [*SNOOZE, *args], stdout=out, stderr=subprocess.STDOUT, env=env
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, as Kubernetes stops a pod; the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)
            tail = self.output()[-3000:]
            raise AssertionError(f"did not stop within {timeout}s:\n{tail}") from None

    def wait(self, timeout: float = 30.0) -> int:
        return self.popen.wait(timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
