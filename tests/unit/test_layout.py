"""The layout table (docs/layout.md) matches the tree: each path it names exists, each package is
named; and every test the docs cite as proof exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "snooze"


def layout_rows() -> list[str]:
    page = (ROOT / "docs" / "layout.md").read_text()
    return [line for line in page.splitlines() if line.startswith("| `")]


def named_paths() -> set[Path]:
    found: set[Path] = set()
    for row in layout_rows():
        cell = row.split("|")[1]
        paths = re.findall(r"`([^`]+)`", cell)
        # Later names in a cell are beside the first: `a/b.py`, `c.py` means a/c.py too.
        base = ROOT / (paths[0] if paths[0].endswith("/") else Path(paths[0]).parent)
        for text in paths:
            found.add(ROOT / text if "/" in text else base / text)
    return found


def test_every_path_in_the_layout_table_exists() -> None:
    missing = sorted(str(p.relative_to(ROOT)) for p in named_paths() if not p.exists())
    assert not missing, f"docs/layout.md's table names paths that do not exist: {missing}"


def test_every_package_and_top_level_module_is_in_the_table() -> None:
    named = named_paths()
    parts = [p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()]
    parts += [p for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    unnamed = sorted(p.name for p in parts if p not in named)
    assert not unnamed, f"docs/layout.md's table does not mention {unnamed}"


def test_the_rows_of_the_core_packages_name_each_of_their_modules() -> None:
    # A module of a subpackage is named in the subpackage's own row, if it has one, or else
    # in its package's.
    rows = {row.split("`")[1]: row for row in layout_rows()}
    for package in ("policy", "operator", "gateway", "engine", "kube"):
        for module in (PACKAGE / package).rglob("*.py"):
            if module.name == "__init__.py":
                continue
            folder = module.parent.relative_to(ROOT).as_posix() + "/"
            row = rows.get(folder) or rows[f"operator/snooze/{package}/"]
            assert f"`{module.name}`" in row, f"the {folder} row does not name {module.name}"


def test_every_package_says_what_lives_there() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        text = init.read_text().lstrip()
        assert text.startswith('"""'), f"{init.relative_to(ROOT)} has no docstring"


def test_every_test_the_docs_cite_exists() -> None:
    """The docs' tables say which test proves each guarantee: each cited file exists (a bare
    file name is the one file of that name under tests/), and so does each cited test."""
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
    missing = []
    cited = re.findall(r"`((?:tests/[a-z_/]+/)?test_[a-z0-9_]+\.py)(?:::([a-z0-9_]+))?", text)
    assert len(cited) > 10  # the pattern finds what the tables cite
    for name, function in cited:
        found = [ROOT / name] if "/" in name else list((ROOT / "tests").rglob(name))
        if len(found) != 1 or not found[0].exists():
            missing.append(name)
        elif function and f"def {function}(" not in found[0].read_text():
            missing.append(f"{name}::{function}")
    assert not missing, f"the docs cite tests that do not exist, or are ambiguous: {missing}"
