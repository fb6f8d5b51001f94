"""The `snooze` command offers every subcommand the docs document, each with its help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

COMMANDS = ["crd", "sim", "sandbox", "operator", "gateway", "check", "demo"]


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


def test_the_demo_and_the_readme_name_the_same_affected_vllm_releases() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    out = subprocess.run(
        [sys.executable, "-m", "snooze.cli", "demo", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "0.12.0 to 0.26.x" in " ".join(out.split())
    assert "0.12.0 to 0.26.x" in readme


@pytest.mark.parametrize("command", ["sim", "sandbox", "operator", "gateway", "demo"])
def test_one_verbosity_flag_for_every_part(command: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "snooze.cli", command, "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--log-level LEVEL" in out and "-v, --verbose" in out
    assert ("--log-format" in out) == (command != "demo")  # the demo logs to its own file


@pytest.mark.parametrize(
    "flags", [["-v"], ["--verbose"], ["--log-level", "DEBUG"], ["--log-level", "debug"]]
)
def test_the_debug_spellings_are_one_flag(flags: list[str]) -> None:
    from snooze.cli import build_parser

    assert build_parser().parse_args(["operator", *flags]).log_level == "debug"
    assert build_parser().parse_args(["operator"]).log_level == "info"


def first_record(*command: str) -> tuple[dict[str, Any], int, str, list[dict[str, Any]]]:
    """Run `snooze COMMAND --log-format json` until its first record, then SIGTERM it: that
    record, the exit code, what it printed on stdout and its other records."""
    process = subprocess.Popen(
        [sys.executable, "-m", "snooze.cli", *command, "--log-format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        record = json.loads(process.stderr.readline())
    finally:
        process.terminate()
        out, err = process.communicate(timeout=40)
    return record, process.returncode, out, [json.loads(line) for line in err.splitlines()]


def test_the_simulator_logs_json_lines() -> None:
    record, code, _, _ = first_record("sim", "--port", "0")
    assert record["severity"] == "info" and "serving 1 engine" in record["message"]
    assert code == 0  # SIGTERM stops it cleanly, as a container's stop would


def test_the_simulator_says_when_it_speaks_for_a_release_never_read() -> None:
    record, _, _, _ = first_record("sim", "--port", "0", "--vllm-version", "0.40.0")
    assert record["severity"] == "warn", record
    assert record["message"] == (
        "vLLM 0.40.0 was not read: it is simulated as 0.34.0 is, the newest release read "
        "(docs/vllm-contract.md)"
    )
    quiet, _, _, _ = first_record("sim", "--port", "0", "--vllm-version", "0.34.0")
    assert "serving 1 engine" in quiet["message"]  # a release read: nothing to tell


def test_the_sandbox_logs_json_lines(tmp_path: Path) -> None:
    record, code, out, rest = first_record(
        "sandbox", "--port", "0", "--kubeconfig", str(tmp_path / "kc")
    )
    assert record["severity"] == "info" and "kubeconfig written to" in record["message"]
    assert out == ""  # nothing but records
    assert [r["message"] for r in rest] == ["stopped"] and code == 0


def test_the_gateway_logs_json_lines(tmp_path: Path) -> None:
    from .test_cli_kubeconfig import write_kubeconfig

    # An API that is not there: the gateway still listens (and says so) while it retries.
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", {"token": "t"})
    record, _, _, _ = first_record("gateway", "--kubeconfig", str(kubeconfig), "--port", "0")
    assert record["severity"] == "info" and "gateway listening on" in record["message"]


def test_the_docs_name_every_option_of_the_demo() -> None:
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "getting-started.md").read_text()
    out = subprocess.run(
        [sys.executable, "-m", "snooze.cli", "demo", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    usage = out[: out.index("\n\n")]
    # `[--hybrid-wake-crash | --no-hybrid-wake-crash]`: the page names the one that changes
    # the default.
    options = set(re.findall(r"(?<![\w-])(--[a-z-]+|-v)\b", usage)) - {"-h", "--hybrid-wake-crash"}
    assert "--duration" in options and "--no-hybrid-wake-crash" in options
    paragraph = page[page.index("`snooze demo --help` lists its options") :]
    paragraph = paragraph[: paragraph.index("\n\n")]
    assert [o for o in sorted(options) if f"`{o}`" not in paragraph] == []
