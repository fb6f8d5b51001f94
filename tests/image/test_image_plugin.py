"""The entry point function and the check, each in a fresh process with a fake `vllm` package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from snooze_vllm_patch.plugin import TARGET_MODULE

PLUGIN_SRC = Path(__file__).resolve().parents[2] / "images" / "vllm" / "plugin" / "src"

pytestmark = pytest.mark.vllm_wheels

INSPECT = f"""
import json, sys
from snooze_vllm_patch.fix import is_hybrid_safe
from {TARGET_MODULE} import GPUModelRunner
method = GPUModelRunner.init_fp8_kv_scales
print(json.dumps({{
    "patched": is_hybrid_safe(method),
    "wrapped_twice": is_hybrid_safe(getattr(method, "__wrapped__", None)),
}}))
"""

REGISTER_TWICE = f"""
import sys
from snooze_vllm_patch import plugin
plugin.register()
plugin.register()
# Plugin import and registration load neither torch nor the runner's module.
assert "torch" not in sys.modules, "torch imported"
assert "{TARGET_MODULE}" not in sys.modules, "runner imported"
"""

USE_PATCHED = f"""
import torch
from snooze_vllm_patch import plugin
plugin.register()
from {TARGET_MODULE} import Attention, GPUModelRunner
state = [torch.ones(3), torch.ones(2)]
attn = Attention()
runner = GPUModelRunner("fp8", [torch.ones(4), None, state], {{"attn": attn}})
runner.init_fp8_kv_scales()
assert all(int(torch.count_nonzero(t)) == 0 for t in state)
assert attn._k_scale.item() == 1.0
print("ok")
"""


def info_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "[snooze_vllm_patch]" in line]


def result(python: Any, script: str, vllm: Path, **env: str) -> Any:
    done = python(script, path=[vllm, PLUGIN_SRC], env=env)
    assert done.returncode == 0, done.stderr
    return done


def test_register_patches_an_affected_release_once_on_import(python: Any, fake_vllm: Any) -> None:
    done = result(python, REGISTER_TWICE + INSPECT, fake_vllm("0.26.0"))
    assert '"patched": true' in done.stdout
    assert '"wrapped_twice": false' in done.stdout
    (line,) = info_lines(done.stderr)
    assert line.startswith("INFO ")
    assert "patched GPUModelRunner.init_fp8_kv_scales" in line
    assert "vLLM 0.26.0" in line


def test_register_patches_an_already_imported_runner(python: Any, fake_vllm: Any) -> None:
    script = f"import {TARGET_MODULE}\nfrom snooze_vllm_patch import plugin\n"
    script += "plugin.register()\nplugin.register()\n" + INSPECT
    done = result(python, script, fake_vllm("0.26.0"))
    assert '"patched": true' in done.stdout
    assert '"wrapped_twice": false' in done.stdout
    assert len(info_lines(done.stderr)) == 1


@pytest.mark.parametrize("body", ["0.12.0", "0.26.0"])
def test_the_patched_runner_wakes_a_hybrid_cache(python: Any, fake_vllm: Any, body: str) -> None:
    done = result(python, USE_PATCHED, fake_vllm(body, body))
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize(
    ("version", "body", "says"),
    [
        ("0.27.0", "0.27.0", "vLLM 0.27.0 is fixed"),
        ("0.11.2", "0.26.0", "vLLM 0.11.2 is unaffected"),
        ("dev", "0.26.0", "vLLM dev is unknown"),
        ("0.26.0", None, "vLLM 0.26.0 has no GPUModelRunner.init_fp8_kv_scales"),
    ],
)
def test_register_leaves_other_releases_alone(
    python: Any, fake_vllm: Any, version: str, body: str | None, says: str
) -> None:
    script = "from snooze_vllm_patch import plugin\nplugin.register()\n"
    script += f"import {TARGET_MODULE}\n"
    if body is not None:
        script += INSPECT
    done = result(python, script, fake_vllm(version, body))
    assert '"patched": true' not in done.stdout
    (line,) = info_lines(done.stderr)
    assert says in line


CHECK = "import sys\nfrom snooze_vllm_patch.check import main\nsys.exit(main([]))\n"
# What `python -m snooze_vllm_patch check` runs.
CHECK_MODULE = (
    "import runpy, sys\n"
    "sys.argv = ['snooze_vllm_patch', 'check']\n"
    "runpy.run_module('snooze_vllm_patch', run_name='__main__')\n"
)


def check(python: Any, *path: Path, **env: str) -> Any:
    return python(CHECK, path=[*path, PLUGIN_SRC], env=env)


def test_check_passes_when_the_plugin_is_registered(
    python: Any, fake_vllm: Any, plugin_entry_points: Path
) -> None:
    done = check(python, fake_vllm("0.26.0"), plugin_entry_points)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("patched: vLLM 0.26.0")
    assert "plugins called: snooze_hybrid_kv_fix" in done.stdout


def test_check_module_command(python: Any, fake_vllm: Any, plugin_entry_points: Path) -> None:
    done = python(CHECK_MODULE, path=[fake_vllm("0.26.0"), plugin_entry_points, PLUGIN_SRC])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("patched:")


def test_check_fails_without_the_plugin(python: Any, fake_vllm: Any) -> None:
    done = check(python, fake_vllm("0.26.0"))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("unpatched: vLLM 0.26.0")


@pytest.mark.parametrize(
    ("allowed", "code"),
    [("", 1), ("other", 1), ("other,snooze_hybrid_kv_fix", 0), ("snooze_hybrid_kv_fix", 0)],
)
def test_check_honours_vllm_plugins(
    python: Any, fake_vllm: Any, plugin_entry_points: Path, allowed: str, code: int
) -> None:
    done = check(python, fake_vllm("0.26.0"), plugin_entry_points, VLLM_PLUGINS=allowed)
    assert done.returncode == code, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("version", "body", "code", "status"),
    [
        ("0.27.0", "0.27.0", 0, "fixed"),
        ("0.29.0", None, 0, "fixed"),
        ("0.11.2", None, 0, "unaffected"),
        ("0.26.0", None, 0, "fixed"),
        ("dev", "0.26.0", 1, "unknown"),
    ],
)
def test_check_reports_other_releases(
    python: Any,
    fake_vllm: Any,
    plugin_entry_points: Path,
    version: str,
    body: str | None,
    code: int,
    status: str,
) -> None:
    done = check(python, fake_vllm(version, body), plugin_entry_points)
    assert done.returncode == code, done.stderr
    said = done.stdout if code == 0 else done.stderr
    assert said.strip().splitlines()[-1].startswith(f"{status}: ")


def test_check_says_when_the_runner_cannot_be_imported(
    python: Any, fake_vllm: Any, plugin_entry_points: Path
) -> None:
    done = check(python, fake_vllm("0.26.0", broken=True), plugin_entry_points)
    assert done.returncode == 2
    assert "cannot inspect vLLM here: no GPU here" in done.stderr
