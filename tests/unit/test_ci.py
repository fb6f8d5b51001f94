"""CI runs the README's test command exactly as printed: .ci/run installs what a fresh machine
lacks and then executes that command, so that a change to either shows here."""

from __future__ import annotations

import re
from pathlib import Path

import docs_pages

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_test_command_as_printed() -> None:
    [block] = [b for b in docs_pages.command_blocks(docs_pages.read("README.md")) if
               "tests/run" in b.body]  # fmt: skip
    [command] = block.body.split("\n")[:1]
    assert command == "bash tests/run"
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert lines[-1] == f"exec {command}", "the last line of .ci/run runs the README's command"
    # It runs from the repository's root, as the README's reader does.
    assert 'cd "$(dirname "$0")/.."' in lines


def test_the_test_command_builds_the_site_strictly() -> None:
    """The docs site is part of the test command: a broken link fails it."""
    script = (ROOT / "tests" / "run").read_text()
    lines = script.splitlines()
    [line] = [line for line in lines if "mkdocs build" in line and not line.startswith("echo")]
    assert "--strict" in line.split() and '"$site"' in line.split()


def test_the_readme_says_what_the_test_command_installs() -> None:
    """Every Debian package tests/run installs (`need PROGRAM PACKAGE`, `install PACKAGE`) is
    named in the README's sentence before the command, with the Go it needs and torch's size."""
    script = (ROOT / "tests" / "run").read_text()
    packages = set(re.findall(r"^\s*need \S+ (\S+)$", script, re.M))
    packages |= set(re.findall(r"\binstall ([a-z0-9.-]+)$", script, re.M))
    assert {"prometheus", "curl", "git", "openssl", "npm", "iproute2", "util-linux"} <= packages
    assert "python3-venv" in packages
    readme = docs_pages.read("README.md")
    before = readme.split("<!-- test: tests/unit/test_ci.py -->")[0].strip()
    sentence = " ".join(before.split("\n\n")[-1].split())
    named = set(re.findall(r"`([a-z0-9.-]+)`", sentence))
    assert packages <= named, f"tests/run installs {sorted(packages - named)}, unsaid"
    assert "Go 1." in sentence and "CUDA" in sentence and "GB" in sentence, sentence
