"""Every tier collects in one `pytest tests`: same-named test modules of two tiers stay apart,
and the helpers imported by bare name stay unique."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def tiers() -> list[Path]:
    return sorted(path.parent for path in TESTS.glob("*/test_*.py"))


def pythonpath() -> list[Path]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [ROOT / folder for folder in config["tool"]["pytest"]["ini_options"]["pythonpath"]]


def test_every_test_file_of_every_tier_collects_in_one_run() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    collected = {line.split("::")[0] for line in run.stdout.splitlines() if "::" in line}
    on_disk = {path.relative_to(ROOT).as_posix() for path in TESTS.glob("*/test_*.py")}
    assert on_disk - collected == set(), "test files with nothing collected"
    assert re.search(r"^\d+ tests collected", run.stdout, re.MULTILINE), run.stdout[-2000:]


def test_every_tier_is_a_package() -> None:
    assert (TESTS / "__init__.py").is_file()
    for tier in tiers():
        assert (tier / "__init__.py").is_file(), f"{tier.name}: add an __init__.py"


def test_the_modules_imported_by_bare_name_are_unique() -> None:
    """A name found twice on pytest's pythonpath would be imported from whichever folder comes
    first; so would tests/cluster/cluster.py, but for "tests" coming after the tiers' folders
    (there `cluster` is the tier's package)."""
    names = Counter(
        path.stem
        for folder in pythonpath()
        for path in folder.glob("*.py")
        if path.name != "__init__.py"
        and path.name != "conftest.py"
        and not path.name.startswith("test_")
    )
    assert [name for name, count in names.items() if count > 1] == []
    assert set(tiers()) <= set(pythonpath()), "each tier's helpers by bare name"
    assert pythonpath()[-1] == TESTS, "the tiers' folders before tests/"


def test_conftest_and_test_modules_are_imported_by_their_package() -> None:
    """By bare name, `conftest` or `test_pools` would be another tier's, or a second copy."""
    bare = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                if module == "conftest" or module.startswith("test_"):
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno}: {module}")
    assert bare == [], "import these relatively (`from .conftest import ...`)"
