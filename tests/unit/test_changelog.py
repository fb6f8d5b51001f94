"""CHANGELOG.md keeps Keep a Changelog's form (Unreleased first, then the releases newest first,
each dated in ISO 8601 with only the standard kinds of change, in their order), each release
names the commit of `main` it was, of its date and version, and the README links to it."""

from __future__ import annotations

import datetime
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import docs_pages
import pytest

ROOT = Path(__file__).resolve().parents[2]
UNRELEASED = "## [Unreleased]"
# No version number has been published: releases are numbered in the order they landed.
RELEASE = re.compile(r"## \[Release (\d+)\] - (\d{4}-\d{2}-\d{2})")
# Keep a Changelog 1.1.0's kinds of change, in its order.
KINDS = ["Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"]
LANDED = re.compile(r"^Version (\S+), `main` at `([0-9a-f]{7,40})`\.$", re.M)
VERSION = re.compile(r'^__version__ = "([^"]+)"$', re.M)


@dataclass
class Section:
    heading: str
    body: list[str] = field(default_factory=list)

    def kinds(self) -> list[str]:
        return [line.removeprefix("### ") for line in self.body if line.startswith("### ")]


def sections() -> list[Section]:
    """The level-2 sections of CHANGELOG.md, in order, each with the lines under it."""
    lines = docs_pages.read("CHANGELOG.md").splitlines()
    assert lines[0] == "# Changelog", "CHANGELOG.md starts with '# Changelog'"
    found: list[Section] = []
    for line in lines[1:]:
        if line.startswith("## "):
            found.append(Section(line))
        elif found:
            found[-1].body.append(line)
    return found


def releases() -> list[tuple[int, datetime.date, Section]]:
    parsed = []
    for section in sections()[1:]:
        match = RELEASE.fullmatch(section.heading)
        assert match, f"{section.heading!r} is not '## [Release N] - YYYY-MM-DD'"
        parsed.append((int(match[1]), datetime.date.fromisoformat(match[2]), section))
    return parsed


def test_unreleased_comes_first_then_the_releases_newest_first() -> None:
    assert sections()[0].heading == UNRELEASED
    found = releases()
    numbers = [number for number, _, _ in found]
    assert numbers == list(range(len(found), 0, -1)), f"releases out of order: {numbers}"
    dates = [day for _, day, _ in found]
    assert dates == sorted(dates, reverse=True), f"dates not newest first: {dates}"


@pytest.mark.parametrize("section", sections(), ids=lambda s: s.heading)
def test_changes_are_grouped_by_the_standard_kinds_in_order(section: Section) -> None:
    kinds = section.kinds()
    assert set(kinds) <= set(KINDS), f"{section.heading}: kinds outside {KINDS}: {kinds}"
    assert kinds == sorted(kinds, key=KINDS.index), f"{section.heading}: {kinds} not in order"
    assert len(kinds) == len(set(kinds)), f"{section.heading}: a kind twice in {kinds}"
    if section.heading != UNRELEASED:
        assert kinds, f"{section.heading} lists no change"
    first = next(
        (i for i, line in enumerate(section.body) if line.startswith("### ")), len(section.body)
    )
    stray = [s for s in section.body[first:] if s and not s.startswith(("### ", "- ", "  "))]
    assert not stray, f"{section.heading}: lines that are not list items under a kind: {stray}"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    )


@pytest.mark.needs("git")
def test_each_release_names_a_commit_of_its_date_and_version_in_order() -> None:
    assert _git("rev-parse", "--git-dir").returncode == 0, "the tests run from a git checkout"
    later = "HEAD"
    for number, day, section in releases():
        landed = LANDED.search("\n".join(section.body))
        assert landed, f"Release {number} does not say 'Version V, `main` at `COMMIT`.'"
        version, commit = landed[1], landed[2]
        if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"
            assert not shallow, (
                f"a shallow clone does not hold Release {number}'s {commit}: run "
                "`git fetch --unshallow` (bash tests/run does it)"
            )
            raise AssertionError(f"Release {number}: no commit {commit} in this repository")
        date = _git("show", "-s", "--format=%ad", "--date=short", commit).stdout.strip()
        assert date == day.isoformat(), f"Release {number} is dated {day}, {commit} {date}"
        ancestor = _git("merge-base", "--is-ancestor", commit, later).returncode == 0
        assert ancestor, f"Release {number}'s {commit} does not come before {later}"
        package = _git("show", f"{commit}:operator/snooze/__init__.py").stdout
        carried = VERSION.search(package)
        assert carried and carried[1] == version, f"{commit} carries {carried}, not {version}"
        later = commit


def test_the_readme_links_the_changelog() -> None:
    assert "](CHANGELOG.md)" in docs_pages.section("README.md", "## Documentation")
