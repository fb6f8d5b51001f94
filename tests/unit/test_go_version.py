"""tests/k8s/build asks for one Go release, the one its modules' go.mod files need, in one
message whether Go is missing or too old; the README and the testing page name the same one."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tests" / "k8s" / "build"


def needed() -> str:
    """The highest `go` directive of the modules tests/k8s/build builds."""
    versions = [
        tuple(int(part) for part in match.split("."))
        for mod in (ROOT / "tests" / "k8s").glob("*/go.mod")
        for match in re.findall(r"^go ([0-9.]+)$", mod.read_text(), re.M)
    ]
    return ".".join(str(part) for part in max(versions)[:2])


def build_with(go_version: str | None, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the build with a `go` that reports GO_VERSION (or with none on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if go_version is not None:
        fake = bin_dir / "go"
        fake.write_text(f'#!/bin/sh\n[ "$*" = "env GOVERSION" ] && echo go{go_version}\nexit 0\n')
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(["bash", str(BUILD)], env=env, capture_output=True, text=True)


@pytest.mark.parametrize("go_version", [None, "1.24.0", "1.25.9"])
def test_a_missing_or_old_go_gets_one_message_with_one_version(
    go_version: str | None, tmp_path: Path
) -> None:
    done = build_with(go_version, tmp_path)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert f"Go {needed()} or newer is needed" in line, line
    assert f"found {'go' + go_version if go_version else 'no go on PATH'}" in line, line
    # One version in the message: the one the modules need.
    rest = line.replace(f"go{go_version}", "") if go_version else line
    assert set(re.findall(r"\b1\.\d+", rest)) == {needed()}, line


def test_the_pages_ask_for_the_version_the_build_needs() -> None:
    for page in ("README.md", "docs/testing.md", "CONTRIBUTING.md"):
        text = " ".join((ROOT / page).read_text().split())
        asked = set(re.findall(r"Go (1\.\d+) or newer", text))
        assert asked == {needed()}, page
