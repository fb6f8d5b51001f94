"""How to build the docs site, as docs/testing.md and CONTRIBUTING.md print it: the MkDocs
packages at the test extra's pins, and a strict build that writes the site."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import docs_pages
import pytest

ROOT = docs_pages.ROOT
PAGES = {"docs/testing.md": "## The docs site", "CONTRIBUTING.md": "## The docs"}
PINS = {"mkdocs", "mkdocs-material"}


def page_commands() -> dict[str, str]:
    found = {}
    for page, heading in PAGES.items():
        [command] = [
            c for c in docs_pages.commands(docs_pages.section(page, heading)) if "mkdocs" in c
        ]
        found[page] = command
    return found


def test_the_pages_print_one_command_with_the_test_extras_pins() -> None:
    commands = page_commands()
    assert len(set(commands.values())) == 1, commands
    [command] = set(commands.values())
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = {
        name: text
        for text in extra["optional-dependencies"]["test"]
        if (name := re.split(r"[=<>\[]", text)[0]) in PINS
    }
    assert set(pinned) == PINS
    for requirement in pinned.values():
        assert f" {requirement} " in command, requirement


@pytest.mark.needs("bash")
def test_the_site_builds_as_printed(tmp_path: Path) -> None:
    """Run in a copy of the site's sources, with this checkout's virtualenv as `.venv`, so
    that the `site/` it writes is the copy's."""
    [command] = set(page_commands().values())
    copy = tmp_path / "snooze"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy2(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    (copy / ".venv").symlink_to(ROOT / ".venv")
    env = {k: v for k, v in os.environ.items() if k != "NO_MKDOCS_2_WARNING"}
    done = subprocess.run(
        ["bash", "-c", command], cwd=copy, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    index = (copy / "site" / "index.html").read_text()
    assert "<title>" in index and "Snooze" in index
    assert (copy / "site" / "testing" / "index.html").is_file()
