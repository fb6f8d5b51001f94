"""The docs as a person reads them: the pages (the README, docs/, the chart's README), their
sections by heading, their command blocks, and the comment before each block that names the
test running it (`<!-- test: tests/x.py, tests/y.py -->`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND_LANGS = ("sh", "bash", "console", "shell")
"""Fenced blocks in these languages are commands: each must name its test."""
CLAIM = re.compile(r"^\s*<!-- test: (.+?) -->\s*$")
FENCE = re.compile(r"^( *)```(\S*)\s*$")


def pages() -> list[Path]:
    """Every page whose commands are run by tests: the README, CONTRIBUTING.md, docs/ and the
    chart's README."""
    return [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "charts" / "snooze" / "README.md",
    ]


def read(page: str) -> str:
    """A page by its path from the repository's root, as a test names it."""
    return (ROOT / page).read_text()


def section(page: str, heading: str) -> str:
    """From `heading` (a whole line, `## ...`) to the next heading of its level or above."""
    text = read(page)
    start = text.index(heading + "\n")
    level = len(heading) - len(heading.lstrip("#"))
    below = text[start + len(heading) + 1 :]
    end = re.search(rf"^#{{1,{level}}} ", below, re.M)
    return heading + "\n" + (below[: end.start()] if end else below)


@dataclass(frozen=True)
class Block:
    line: int
    """1-based line of the opening fence."""
    lang: str
    body: str
    claimed_by: tuple[str, ...]
    """The tests the comment before the block names; empty without one."""


def blocks(text: str) -> list[Block]:
    """Every fenced block, indented ones too, with the claim just before it."""
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, lang = opening.groups()
        end = next(
            j for j in range(i + 1, len(lines)) if lines[j].strip() == "```" and
            lines[j].startswith(indent)
        )  # fmt: skip
        body = "\n".join(line[len(indent) :] for line in lines[i + 1 : end])
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        claim = CLAIM.match(before)
        tests = tuple(t.strip() for t in claim.group(1).split(",")) if claim else ()
        found.append(Block(i + 1, lang, body + "\n", tests))
        i = end + 1
    return found


def command_blocks(text: str) -> list[Block]:
    return [b for b in blocks(text) if b.lang in COMMAND_LANGS]


def commands(text: str) -> list[str]:
    """The lines of the command blocks of `text`, continuation lines joined, comments and
    blank lines left out."""
    found = []
    for block in command_blocks(text):
        for line in block.body.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                found.append(line.strip())
    return found
