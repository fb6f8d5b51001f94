"""A kubeconfig the operator or the gateway cannot use is one line naming it, and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

COMMANDS = ["operator", "gateway"]


def snooze(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "snooze.cli", *args],
        capture_output=True,
        text=True,
        env={**environ, **(env or {})},
        timeout=timeout,
    )


def refused(result: subprocess.CompletedProcess[str], *names: str) -> str:
    """The one line on stderr, which names what to fix."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


def write_kubeconfig(path: Path, user: dict[str, object]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "here",
            }
        )
    )
    return path


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_kubeconfig_flag(command: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-kubeconfig")
    line = refused(snooze(command, "--kubeconfig", missing), missing)
    assert line.startswith(f"snooze {command}: ")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_kubeconfig_variable(command: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-kubeconfig")
    refused(snooze(command, env={"KUBECONFIG": missing}), missing, "KUBECONFIG")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unreadable_kubeconfig(command: str, tmp_path: Path) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    refused(snooze(command, "--kubeconfig", str(folder)), str(folder))
    garbled = tmp_path / "garbled"
    garbled.write_text("clusters: [\n")
    refused(snooze(command, "--kubeconfig", str(garbled)), str(garbled), "YAML")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_context(command: str, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kubeconfig", {"token": "t"})
    refused(snooze(command, "--kubeconfig", str(path), "--context", "nope"), str(path), "nope")


def test_a_failing_exec_plugin_says_why(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text("import sys; sys.exit('the SSO session expired: run aws sso login')\n")
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(plugin)],
        }
    }
    path = write_kubeconfig(tmp_path / "kubeconfig", user)
    refused(snooze("operator", "--kubeconfig", str(path)), str(path), "run aws sso login")
