"""The plugin distribution, built and installed into a scratch venv, as the image installs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest
import torch

PLUGIN = Path(__file__).resolve().parents[2] / "images" / "vllm" / "plugin"

ENTRY_POINTS = """
import json
from importlib.metadata import distribution, entry_points
print(json.dumps({
    "plugins": [[ep.name, ep.value] for ep in entry_points(group="vllm.general_plugins")],
    "scripts": [[ep.name, ep.value] for ep in entry_points(group="console_scripts")
                if ep.name.startswith("snooze")],
    "requires": distribution("snooze-vllm-hybrid-kv-fix").requires,
}))
"""


@pytest.fixture(scope="module")
def scratch_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding only the plugin, built offline with this interpreter's setuptools."""
    root = tmp_path_factory.mktemp("plugin-venv")
    # A copy, so the build leaves no build/ or egg-info in the source tree.
    source = shutil.copytree(
        PLUGIN, root / "src", ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    pip = [sys.executable, "-m", "pip", "--quiet"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", root / "dist", source],
        check=True,
    )
    (wheel,) = (root / "dist").glob("snooze_vllm_hybrid_kv_fix-*.whl")
    env = root / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    subprocess.run(
        [*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], check=True
    )
    return env


def test_the_distribution_declares_the_vllm_entry_point(scratch_venv: Path) -> None:
    done = subprocess.run(
        [scratch_venv / "bin" / "python", "-c", ENTRY_POINTS],
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout)
    assert found["plugins"] == [["snooze_hybrid_kv_fix", "snooze_vllm_patch.plugin:register"]]
    assert found["scripts"] == [["snooze-vllm-check", "snooze_vllm_patch.check:main"]]
    # Nothing that could replace the image's vLLM or torch.
    assert found["requires"] is None


@pytest.mark.vllm_wheels
@pytest.mark.parametrize(("allowed", "code"), [(None, 0), ("someone_else", 1)])
def test_the_installed_check_proves_the_patch(
    scratch_venv: Path, fake_vllm: Any, allowed: str | None, code: int
) -> None:
    """The console script finds the installed entry point as vLLM would, and calls it."""
    # torch comes from the test environment: the fake runner holds the real decorated body.
    torch_site = Path(torch.__file__).resolve().parents[1]
    environ = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    environ["PYTHONPATH"] = os.pathsep.join([str(fake_vllm("0.26.0")), str(torch_site)])
    if allowed is not None:
        environ["VLLM_PLUGINS"] = allowed
    done = subprocess.run(
        [scratch_venv / "bin" / "snooze-vllm-check"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == code, done.stdout + done.stderr
    if code == 0:
        assert done.stdout.startswith("patched: vLLM 0.26.0")
        assert "patched GPUModelRunner.init_fp8_kv_scales" in done.stderr
    else:
        assert "unpatched: vLLM 0.26.0" in done.stderr
