"""The README's first command, run exactly as printed on a fresh copy of the repository: a
virtualenv, the package with its demo extra from the package index, and `snooze demo` at its
defaults, which answers every request and writes its timeline and summary."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import docs_pages
import pytest
from ports import printed_addresses

pytestmark = pytest.mark.needs("bash", "git")

PAGES = ["README.md", "docs/getting-started.md"]
COMMAND = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[demo]' && .venv/bin/snooze demo"


def test_the_pages_print_it() -> None:
    for page in PAGES:
        assert COMMAND in docs_pages.commands(docs_pages.read(page)), page


def fresh_copy(to: Path) -> Path:
    """The repository's files as a clone has them (tracked, and new ones not ignored)."""
    names = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=docs_pages.ROOT, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    for name in names:
        source = docs_pages.ROOT / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    return to


def test_the_demo_command_runs_as_printed(tmp_path: Path) -> None:
    clone = fresh_copy(tmp_path / "snooze")
    with printed_addresses():  # another run's demo or walkthrough would hold port 8080
        with socket.socket() as s:  # the demo's gateway takes port 8080 by default
            if s.connect_ex(("127.0.0.1", 8080)) == 0:
                pytest.fail("127.0.0.1:8080 is taken: the demo's gateway needs it; stop it")
        done = subprocess.run(
            ["bash", "-c", COMMAND], cwd=clone, capture_output=True, text=True, timeout=900
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = clone / "snooze-demo"
    models = json.loads((out / "summary.json").read_text())["models"]
    assert models and all(m["requests"] > 0 for m in models), models
    # Every request answered: the hybrid model's failed wake is the one error it expects.
    assert all(m["errors"] == m["expected_errors"] for m in models), models
    assert all(m["unanswered"] == 0 for m in models), models
    assert (out / "timeline.png").read_bytes().startswith(b"\x89PNG")
    assert f"timeline: {out.relative_to(clone)}/timeline.png" in done.stdout
