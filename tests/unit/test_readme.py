"""The README reads in minutes: at most 15 KB, and its first screen says what Snooze is, how to
see it work and test it, and, plainly, what sleep does and does not give back on Kubernetes."""

from __future__ import annotations

import docs_pages

LIMIT = 15_000


def test_the_readme_is_at_most_15_kb() -> None:
    size = len(docs_pages.read("README.md").encode())
    assert size <= LIMIT, f"README.md is {size} bytes: move the detail into a page of docs/"


def test_the_first_screen_says_what_matters() -> None:
    text = docs_pages.read("README.md")
    first = " ".join(text[: text.index("\n## ")].split())
    assert "a sleeping pod keeps its GPU" in first
    assert "GPU pool" in first and "to zero" in first
    commands = docs_pages.commands(text[: text.index("\n## ")])
    assert commands[0].endswith(".venv/bin/snooze demo") and "bash tests/run" in commands
    assert "as root" in first and "Go 1.26" in first and "control plane" in first
