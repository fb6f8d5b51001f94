"""`pip install '.[demo]'` gives every process what it imports: the package imports nothing that
only the test extra (or nothing at all) installs; and the operator, the gateway and every part
but the tools that have an extra import nothing beyond the base install."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "snooze"


# The parts whose commands need an extra (snooze/extras.py); whatif draws its picture with the
# demo's matplotlib when it is there, and says what to install when it is not.
WITH_EXTRAS = {"sandbox", "demo"}
OPTIONAL = {("matplotlib", "operator/snooze/whatif/picture.py")}


def imported_modules(parts: set[str] | None = None) -> dict[str, set[str]]:
    """Top-level third-party modules the package (or those of its PARTS) imports -> the
    files that import them."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        part = path.relative_to(PACKAGE).parts[0]
        if parts is not None and part not in parts:
            continue
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


def not_installed(imported: dict[str, set[str]], available: set[str]) -> dict[str, list[str]]:
    distributions = metadata.packages_distributions()
    return {
        module: sorted(files)
        for module, files in imported.items()
        if not any(
            d.lower().replace("_", "-") in available for d in distributions.get(module, [module])
        )
    }


def test_the_demo_extra_brings_everything_the_package_imports() -> None:
    missing = not_installed(imported_modules(), installed_with({"demo"}))
    assert missing == {}, "imported, but not installed by pip install '.[demo]'"


def test_the_base_install_brings_everything_but_the_tools_import() -> None:
    parts = {p.name for p in PACKAGE.iterdir() if p.is_dir() or p.suffix == ".py"} - WITH_EXTRAS
    imported = {
        module: {f for f in files if (module, f) not in OPTIONAL}
        for module, files in imported_modules(parts).items()
    }
    missing = not_installed({m: f for m, f in imported.items() if f}, installed_with(set()))
    assert missing == {}, "imported outside the tools, but not installed by pip install ."
    assert "kmock" not in installed_with(set()) and "kmock" in installed_with({"sandbox"})


def test_the_check_sees_test_only_packages() -> None:
    assert "jsonschema" in installed_with({"test"})
    assert "jsonschema" not in installed_with({"demo"})
    assert "matplotlib" in installed_with({"demo"}) and "kopf" in installed_with(set())
