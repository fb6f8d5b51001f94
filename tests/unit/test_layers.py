"""The policy stays pure: it loads no Kubernetes, HTTP or operator framework, and does no I/O."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

# Loaded by the operator's I/O layers, never by the decisions.
FORBIDDEN = (
    "kopf",
    "kubernetes",
    "kmock",
    "httpx",
    "httpcore",
    "aiohttp",
    "requests",
    "urllib3",
    "asyncio",
    "prometheus_client",
)
# What the policy may import besides the standard library: the spec and its durations.
ALLOWED_FIRST_PARTY = {
    "snooze.api.models",
    "snooze.api.gpupool",
    "snooze.api.modelstatus",
    "snooze.api.keepawake",
    "snooze.api.durations",
    "snooze.api.quantities",
    "snooze.api.times",
    "snooze.api.agreed",
    "snooze.api.enginetimes",
    "snooze.api.reasons",
    "snooze.api.conditions",
    "snooze.api.eventreasons",
}
# A pure calculator of cron times (no I/O, no dependencies): schedules are decisions too.
PURE_THIRD_PARTY = {"cronsim"}
# Standard-library modules that exist to do I/O or to run things.
STDLIB_IO = {
    "asyncio",
    "http",
    "io",
    "os",
    "pathlib",
    "select",
    "selectors",
    "shutil",
    "socket",
    "ssl",
    "subprocess",
    "tempfile",
    "threading",
    "time",
    "urllib",
}


def modules_loaded_by(module: str) -> list[str]:
    code = f"import {module}, sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    loaded: list[str] = json.loads(out)
    return loaded


def imports_of(path: Path) -> set[str]:
    """Every module that `path` imports, absolute, at any depth of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import in {path.name}: use `from snooze.x import`"
            assert node.module is not None
            found.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
            in ("__import__", "import_module")
        ):
            pytest.fail(f"{path.name} imports dynamically at line {node.lineno}")
    return found


POLICY_ROOT = Path(importlib.import_module("snooze.policy").__path__[0])
POLICY_MODULES = sorted(
    "snooze.policy." + ".".join(path.relative_to(POLICY_ROOT).with_suffix("").parts)
    for path in POLICY_ROOT.rglob("*.py")
    if path.stem != "__init__"
)


@pytest.mark.parametrize("module", POLICY_MODULES)
def test_importing_the_policy_loads_no_io_layer(module: str) -> None:
    loaded = modules_loaded_by(module)
    leaked = sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN)
    assert not leaked, f"{module} pulls in {leaked}"


def test_the_check_would_see_a_leak() -> None:
    # Guards the test above against passing vacuously (a wrong module name, an empty list).
    loaded = modules_loaded_by("httpx")
    assert "httpx" in loaded


def test_the_policy_modules_are_found() -> None:
    assert {"snooze.policy.sleep", "snooze.policy.scale"} <= set(POLICY_MODULES)


# The API types the policy may read are held to the policy's own rules: one list for both.
API_TYPES = sorted(ALLOWED_FIRST_PARTY)


@pytest.mark.parametrize("module", [*POLICY_MODULES, *API_TYPES])
def test_policy_layer_imports_only_stdlib_and_the_spec(module: str) -> None:
    path = Path(importlib.import_module(module).__file__ or "")
    pydantic = module in (
        "snooze.api.models",
        "snooze.api.modelstatus",
        "snooze.api.gpupool",
        "snooze.api.keepawake",
        "snooze.api.times",
    )
    allowed_third_party = PURE_THIRD_PARTY | ({"pydantic", "pydantic_core"} if pydantic else set())
    # The decisions may read each other (the pool's are split by responsibility), never I/O.
    siblings = "snooze.policy." if module.startswith("snooze.policy.") else None
    for name in sorted(imports_of(path)):
        top = name.split(".")[0]
        # A sibling in the policy is held to these same rules by this test.
        if name in ALLOWED_FIRST_PARTY or name in POLICY_MODULES or top in allowed_third_party:
            continue
        if siblings is not None and name.startswith(siblings):
            continue
        assert top in sys.stdlib_module_names, f"{path.name} imports {name}"
        assert top not in STDLIB_IO, f"{path.name} imports {name}, which does I/O"
