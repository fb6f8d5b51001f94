"""CI runs the README's test command exactly as printed: .ci/run installs what a fresh machine
lacks and then executes that command, so that a change to either shows here."""

from __future__ import annotations

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
