"""Every command that `snooze sandbox --help` suggests runs, as printed, against a sandbox."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.needs("kubectl")

ROOT = Path(__file__).parents[2]
SNOOZE = [sys.executable, "-m", "snooze.cli"]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Path]:
    """`snooze sandbox` in a process of its own, as a user starts it; yields its kubeconfig."""
    kubeconfig = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [*SNOOZE, "sandbox", "--port", "0", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    first = process.stdout.readline()  # printed once it serves and the kubeconfig is written
    assert "serving" in first, first + process.stderr.read() if process.stderr else first
    yield kubeconfig
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 0


def suggested_commands() -> list[str]:
    help_text = subprocess.run(
        [*SNOOZE, "sandbox", "--help"], capture_output=True, text=True, check=True
    ).stdout
    return [
        line.strip()
        for line in help_text.splitlines()
        if line.startswith("  ") and line.strip().startswith(("kubectl ", "export "))
    ]


def test_help_suggests_commands_that_work(served: Path) -> None:
    commands = suggested_commands()
    assert any(c.startswith("kubectl apply") for c in commands)
    assert not [c for c in commands if "--validate=false" in c]
    # FILE is where the user put the kubeconfig; everything else runs exactly as printed.
    script = "\n".join(c.replace("=FILE", f"={served}") for c in commands)
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBECACHEDIR")}
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "chat-0" in result.stdout  # kubectl get pods
    assert "inferencemodel.snooze.dev/chat created" in result.stdout
    assert "KIND:       InferenceModel" in result.stdout  # kubectl explain
