"""The README's sandbox walkthrough, as a person runs it: separate processes and kubectl."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
SNOOZE = [sys.executable, "-m", "snooze.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def engines_free() -> bool:
    """The walkthrough's engines listen on 127.0.0.2 and 127.0.0.3, port 8000."""
    for host in ("127.0.0.2", "127.0.0.3"):
        with socket.socket() as s:
            if s.connect_ex((host, 8000)) == 0:
                return False
    return True


class Walkthrough:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.kubeconfig = tmp / "kubeconfig"
        self.env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "KUBECACHEDIR": str(tmp / "cache"),
        }
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str) -> None:
        log = (self.tmp / f"{name}.log").open("wb")
        self.processes.append(
            subprocess.Popen(
                [*SNOOZE, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
            )
        )

    def kubectl(self, *args: str) -> str:
        result = subprocess.run(
            ["kubectl", *args], env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture
def walkthrough(tmp_path: Path) -> Iterator[Walkthrough]:
    if not engines_free():
        pytest.fail("127.0.0.2:8000 or 127.0.0.3:8000 is taken: stop what listens there")
    w = Walkthrough(tmp_path)
    yield w
    w.stop()


def test_the_readme_walkthrough(walkthrough: Walkthrough) -> None:
    w = walkthrough
    w.start("sandbox", "sandbox", "--port", str(free_port()), "--kubeconfig", str(w.kubeconfig))
    w.start(
        "sim",
        "sim",
        "--host",
        "127.0.0.2",
        "--count",
        "2",
        "--port",
        "8000",
        "--model",
        "chat",
        "--sleep-seconds",
        "0.2",
        "--wake-seconds",
        "0.2",
    )
    wait_for("the kubeconfig", w.kubeconfig.exists)
    w.start("operator", "operator", "--probe-interval", "0.5")
    assert "created" in w.kubectl("apply", "--validate=false", "-f", "crds/")
    w.kubectl("apply", "--validate=false", "-f", "examples/sandbox/pods.yaml")
    w.kubectl("apply", "--validate=false", "-f", "examples/sandbox/chat.yaml")
    # The README's chat.yaml waits 20 s; a test need not.
    w.kubectl("patch", "im", "chat", "--type", "merge", "-p", '{"spec":{"idle":{"after":"2s"}}}')

    def states() -> str:
        return w.kubectl("get", "pods", "-L", "snooze.dev/state", "--no-headers")

    wait_for("both awake", lambda: states().count("awake") == 2, timeout=30)
    wait_for("both asleep", lambda: states().count("asleep") == 2, timeout=30)
    table = w.kubectl("get", "im")
    header, row = table.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "MODEL", "PHASE", "AWAKE", "ASLEEP"]
    assert row.split()[:5] == ["chat", "chat", "Asleep", "0", "2"]

    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    w.kubectl("annotate", "im", "chat", f"snooze.dev/wake-requested-at={stamp}", "--overwrite")
    wait_for("both awake again", lambda: states().count("awake") == 2, timeout=30)

    def phase() -> list[str]:
        jsonpath = "jsonpath={.status.phase} {.status.lastWakeSeconds}"
        return w.kubectl("get", "im", "chat", "-o", jsonpath).split()

    # The status follows the labels within a cycle.
    awake = wait_for("phase Awake", lambda: (p := phase()) and p[0] == "Awake" and p)
    assert float(awake[1]) > 0
    events = w.kubectl("get", "events")
    assert "Slept" in events and "Woke" in events
