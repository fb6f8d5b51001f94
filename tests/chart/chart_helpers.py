"""Paths and readers shared by the chart tests: the chart's files, its values, the templates."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "snooze"
TEMPLATES = CHART / "templates"
EXAMPLES = ROOT / "examples"
CRDS = ROOT / "crds"

# `.Values.a.b` (also `$.Values.a.b`): the path a template reads.
VALUES_REF = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
# `{{- define "NAME" -}} BODY {{- end }}` where BODY holds no template action.
DEFINE = re.compile(r'\{\{-? define "([^"]+)" -?\}\}\n(.*?)\{\{-? end \}\}', re.DOTALL)


def template_files() -> list[Path]:
    """Every template, helpers and NOTES.txt included."""
    return sorted(p for p in TEMPLATES.iterdir() if p.is_file())


def manifest_templates() -> list[Path]:
    return [p for p in template_files() if p.suffix == ".yaml"]


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = load_yaml(CHART / "values.yaml")
    return loaded


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of a values file onto the defaults: maps merge, the rest replaces."""
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def value_paths(node: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every path of a values tree, maps' inner paths included (lists and scalars are leaves)."""
    if isinstance(node, dict):
        for key, value in node.items():
            path = (*prefix, str(key))
            yield path
            yield from value_paths(value, path)


def value_refs() -> dict[tuple[str, ...], list[str]]:
    """Each `.Values` path the templates read, with the files that read it."""
    refs: dict[tuple[str, ...], list[str]] = {}
    for path in template_files():
        for match in VALUES_REF.finditer(path.read_text()):
            refs.setdefault(tuple(match.group(1).strip(".").split(".")), []).append(path.name)
    return refs


def plain_defines() -> dict[str, str]:
    """The named templates of _helpers.tpl whose body is plain text (no template action), by
    name: the RBAC rule lists."""
    found = DEFINE.findall((TEMPLATES / "_helpers.tpl").read_text())
    return {name: body for name, body in found if "{{" not in body}


@cache
def crd_strict_schema() -> dict[str, Any]:
    """`strict_schema()` of tests/unit/test_crd.py (the CRD's schema with unknown fields
    refused), loaded from that file so that there is one definition of it."""
    source = ROOT / "tests" / "unit" / "test_crd.py"
    spec = importlib.util.spec_from_file_location("snooze_tests_unit_test_crd", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    schema: dict[str, Any] = module.strict_schema()
    return schema
