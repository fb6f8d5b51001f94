"""`pip install '.[demo]'` gives every process what it imports: the package imports nothing that
only the test extra (or nothing at all) installs."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "snooze"


def imported_modules() -> dict[str, set[str]]:
    """Top-level third-party modules the package imports -> the files that import them."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top != "snooze" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def installed_with(extras: set[str]) -> set[str]:
    """Every distribution that `pip install 'snooze[EXTRAS]'` installs, by normalised name."""
    names: set[str] = set()
    todo = [("snooze", frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is not None and not any(
                marker.evaluate({"extra": extra}) for extra in (wanted or {""})
            ):
                continue
            key = requirement.name.lower().replace("_", "-")
            if key not in names:
                names.add(key)
                todo.append((requirement.name, frozenset(requirement.extras)))
    return names


def test_the_demo_extra_brings_everything_the_package_imports() -> None:
    available = installed_with({"demo"})
    distributions = metadata.packages_distributions()
    missing = {
        module: sorted(files)
        for module, files in imported_modules().items()
        if not any(
            d.lower().replace("_", "-") in available for d in distributions.get(module, [module])
        )
    }
    assert missing == {}, "imported, but not installed by pip install '.[demo]'"


def test_the_check_sees_test_only_packages() -> None:
    assert "jsonschema" in installed_with({"test"})
    assert "jsonschema" not in installed_with({"demo"})
    assert "matplotlib" in installed_with({"demo"}) and "kopf" in installed_with(set())
