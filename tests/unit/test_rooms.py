"""The package's rooms stay small: no package holds more than 20 modules, and no module more
than 600 lines, so that listing a folder tells a reader its parts."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

MAX_MODULES = 20
MAX_LINES = 600
ROOT = Path(importlib.import_module("snooze").__path__[0])


def packages_over(root: Path, limit: int) -> dict[str, int]:
    """Each package under `root` that holds more than `limit` modules (its __init__ counted)."""
    counts = {
        str(package.relative_to(root.parent)): len(list(package.glob("*.py")))
        for package in [root, *(p.parent for p in root.rglob("__init__.py"))]
    }
    return {package: count for package, count in counts.items() if count > limit}


def modules_over(root: Path, limit: int) -> dict[str, int]:
    """Each module under `root` longer than `limit` lines."""
    lengths = {
        str(module.relative_to(root.parent)): len(module.read_text().splitlines())
        for module in root.rglob("*.py")
    }
    return {module: lines for module, lines in lengths.items() if lines > limit}


def test_no_package_holds_more_than_20_modules() -> None:
    over = packages_over(ROOT, MAX_MODULES)
    assert over == {}, f"split into rooms of their parts: {over}"


def test_no_module_is_longer_than_600_lines() -> None:
    assert modules_over(ROOT, MAX_LINES) == {}, "split the module by what it does"


def test_the_checks_see_a_package_and_a_module_over_their_limits(tmp_path: Path) -> None:
    # Guards the two tests above against passing vacuously (a wrong root, a glob that finds
    # nothing): a package of 21 modules, one of them 601 lines long, is caught by both.
    root = tmp_path / "pkg"
    (root / "rooms").mkdir(parents=True)
    (root / "__init__.py").write_text('"""A package."""\n')
    (root / "rooms" / "__init__.py").write_text('"""A room."""\n')
    for n in range(MAX_MODULES):
        (root / "rooms" / f"m{n}.py").write_text("x = 1\n")
    (root / "rooms" / "m0.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert packages_over(root, MAX_MODULES) == {"pkg/rooms": MAX_MODULES + 1}
    assert modules_over(root, MAX_LINES) == {"pkg/rooms/m0.py": MAX_LINES + 1}
    assert packages_over(root, MAX_MODULES + 1) == {}


@pytest.mark.parametrize(
    "room", ["operator", "operator/model", "policy/pool", "sim/sglang", "gateway/request"]
)
def test_the_rooms_are_found(room: str) -> None:
    assert (ROOT / room / "__init__.py").is_file()
