"""The `snooze` command offers every subcommand the README documents, each with its help."""

from __future__ import annotations

import subprocess
import sys

import pytest

COMMANDS = ["crd", "sim", "sandbox", "operator", "gateway", "demo"]


def test_every_subcommand_is_listed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "snooze.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in COMMANDS:
        assert f"    {command} " in out, out


@pytest.mark.parametrize("command", COMMANDS)
def test_each_has_help(command: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "snooze.cli", command, "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "usage: snooze " + command in result.stdout
