"""CONTRIBUTING.md's commands are the very lines tests/run runs (the pytest ones are run as
printed by tests/e2e/test_contributing_commands.py, the docs' by test_docs_site.py), and its
map of the package places every part of operator/snooze/."""

from __future__ import annotations

import re

import docs_pages

ROOT = docs_pages.ROOT
PAGE = "CONTRIBUTING.md"
RUN = (ROOT / "tests" / "run").read_text().splitlines()


def block(heading: str, index: int) -> list[str]:
    """The lines of the INDEX-th command block under HEADING."""
    found = docs_pages.command_blocks(docs_pages.section(PAGE, heading))
    return [line for line in found[index].body.splitlines() if line.strip()]


def test_the_set_up_is_what_tests_run_does_first() -> None:
    lines = block("## Set up", 0)
    start = RUN.index(lines[0])
    assert RUN[start : start + len(lines)] == lines


def test_the_test_command_is_the_readmes_and_ci_runs_it() -> None:
    assert block("## Run the tests", 0) == ["bash tests/run"]
    readme = docs_pages.commands(docs_pages.read("README.md"))
    assert "bash tests/run" in readme
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci[-1] == "exec bash tests/run"


def test_the_checks_before_a_commit_are_tests_runs_own_lines() -> None:
    lines = block("## Run the tests", 2)
    assert lines and all(line in RUN for line in lines), [x for x in lines if x not in RUN]
    assert {"mypy", "lint-imports --no-cache"} <= set(lines)


def test_every_part_of_the_package_has_its_row() -> None:
    section = docs_pages.section(PAGE, "## Where a change goes")
    named = set(re.findall(r"^\| `([^`]+)`", section, re.M))
    named |= set(re.findall(r"^\| `[^`]+`, `([^`]+)`", section, re.M))
    package = ROOT / "operator" / "snooze"
    parts = {
        f"{p.name}/" if p.is_dir() else p.name
        for p in package.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists())
        or (p.suffix == ".py" and p.stem != "__init__")
    }
    assert parts <= named, f"parts CONTRIBUTING.md does not place: {sorted(parts - named)}"
