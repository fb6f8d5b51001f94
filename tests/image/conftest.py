"""Fixtures for the patched vLLM image: the plugin on sys.path, real vLLM sources, fake vLLMs."""

from __future__ import annotations

import ast
import builtins
import os
import subprocess
import sys
import tempfile
import textwrap
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "images" / "vllm" / "plugin"
PLUGIN_SRC = PLUGIN / "src"
WHEELS = ROOT / ".cache" / "vllm-wheels"

RUNNER_PATH = "vllm/v1/worker/gpu_model_runner.py"
TORCH_UTILS_PATH = "vllm/utils/torch_utils.py"

# The tests import the plugin from its source tree; the distribution test installs it.
if str(PLUGIN_SRC) not in sys.path:
    sys.path.insert(0, str(PLUGIN_SRC))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "vllm_wheels: downloads vLLM wheels from PyPI (network) once into .cache/vllm-wheels",
    )


def vllm_wheel(version: str) -> Path:
    """Return the cached wheel of a vLLM release, downloading it with pip if missing."""
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if found:
        return found[0]
    WHEELS.mkdir(parents=True, exist_ok=True)
    # A scratch directory first, so an interrupted download never looks cached.
    with tempfile.TemporaryDirectory(dir=WHEELS) as scratch:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                # The Linux wheel is the one images use, whatever machine runs the tests;
                # pip takes platform tags literally, so name each one vLLM has used.
                *(f"--platform=manylinux_2_{glibc}_x86_64" for glibc in (24, 28, 31, 35)),
                "--python-version=3.12",
                "--implementation=cp",
                f"--dest={scratch}",
                f"vllm=={version}",
            ],
            check=True,
        )
        (wheel,) = Path(scratch).glob("vllm-*.whl")
        return wheel.rename(WHEELS / wheel.name)


def wheel_file(version: str, path: str) -> str:
    """Read one source file of a vLLM release from its wheel."""
    with zipfile.ZipFile(vllm_wheel(version)) as wheel:
        return wheel.read(path).decode()


def find_function(source: str, name: str, cls: str | None = None) -> ast.FunctionDef | None:
    """Find a top-level function, or a method of a top-level class, in a module's source."""
    body = ast.parse(source).body
    if cls is not None:
        classes = [node for node in body if isinstance(node, ast.ClassDef) and node.name == cls]
        body = classes[0].body if classes else []
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def function_source(source: str, node: ast.FunctionDef) -> str:
    """The exact source of a function, decorators included, dedented to column 0."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    lines = source.splitlines(keepends=True)[first - 1 : node.end_lineno]
    return textwrap.dedent("".join(lines))


def free_names(node: ast.FunctionDef) -> set[str]:
    """The global names a function (and its decorators) reads, builtins excluded."""
    assigned = {arg.arg for arg in node.args.args}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            assigned.add(sub.id)
    loaded = {
        sub.id
        for sub in ast.walk(node)
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load)
    }
    return loaded - assigned - set(dir(builtins))


class Upstream:
    """The real `init_fp8_kv_scales` of a vLLM release, read from its wheel, vLLM not imported."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.runner_source = wheel_file(version, RUNNER_PATH)
        self.node = find_function(self.runner_source, "init_fp8_kv_scales", cls="GPUModelRunner")

    @property
    def method_source(self) -> str:
        assert self.node is not None, f"vLLM {self.version} has no init_fp8_kv_scales"
        return function_source(self.runner_source, self.node)

    def helper_source(self, name: str) -> str | None:
        """The source of a helper the method calls, from vllm/utils/torch_utils.py, if any."""
        source = wheel_file(self.version, TORCH_UTILS_PATH)
        node = find_function(source, name)
        return None if node is None else function_source(source, node)

    def compile(self, **fakes: Any) -> Callable[..., None]:
        """Compile the real method with the minimal globals its body reads.

        torch is the real (CPU) torch, `is_quantized_kv_cache` the release's own helper;
        the attention classes are given by the caller. A release whose body reads any other
        global fails here, which is the signal to look at that release again.
        """
        import torch

        namespace: dict[str, Any] = {"torch": torch, **fakes}
        helper = self.helper_source("is_quantized_kv_cache")
        if helper is not None:
            exec(compile(helper, f"<vllm {self.version} {TORCH_UTILS_PATH}>", "exec"), namespace)
        assert self.node is not None
        missing = free_names(self.node) - namespace.keys()
        assert not missing, f"vLLM {self.version}'s body reads globals the test lacks: {missing}"
        code = compile(self.method_source, f"<vllm {self.version} {RUNNER_PATH}>", "exec")
        exec(code, namespace)
        method: Callable[..., None] = namespace["init_fp8_kv_scales"]
        return method


@pytest.fixture(scope="session")
def upstream() -> Callable[[str], Upstream]:
    """Factory: the real method of a vLLM release (downloads its wheel once)."""
    cache: dict[str, Upstream] = {}

    def get(version: str) -> Upstream:
        if version not in cache:
            cache[version] = Upstream(version)
        return cache[version]

    return get


FAKE_RUNNER_MODULE = '''\
"""A stand-in for vllm/v1/worker/gpu_model_runner.py around a real method body."""
import torch


class Attention:
    def __init__(self):
        self._k_scale = torch.zeros(1)
        self._v_scale = torch.zeros(1)


class MLAAttention(Attention):
    pass


{helper}


class GPUModelRunner:
    def __init__(self, cache_dtype, kv_caches, layers):
        self.cache_config = type("CacheConfig", (), {{"cache_dtype": cache_dtype}})()
        self.compilation_config = type(
            "CompilationConfig", (), {{"static_forward_context": layers}}
        )()
        self.kv_caches = kv_caches

{method}
'''


def write_fake_vllm(
    root: Path, version: str, *, method: str | None, helper: str | None, broken: bool = False
) -> Path:
    """Write a minimal `vllm` package: a version and a GPUModelRunner holding `method`."""
    package = root / "vllm"
    worker = package / "v1" / "worker"
    worker.mkdir(parents=True)
    (package / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (package / "v1" / "__init__.py").write_text("")
    (worker / "__init__.py").write_text("")
    body = textwrap.indent(method or "pass\n", "    ")
    module = FAKE_RUNNER_MODULE.format(helper=helper or "", method=body)
    if broken:
        module = "raise ImportError('no GPU here')\n" + module
    (worker / "gpu_model_runner.py").write_text(module)
    return root


def write_plugin_dist_info(root: Path) -> Path:
    """Register the plugin's entry points (read from its pyproject) in a sys.path directory."""
    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    dist_info = root / f"snooze_vllm_hybrid_kv_fix-{project['version']}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = []
    for group, entries in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines.extend(f"{name} = {value}" for name, value in entries.items())
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root


def run_python(
    script: str, *, path: list[Path], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a script in a fresh interpreter with `path` first on sys.path."""
    environ = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    environ["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", script], env=environ, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def fake_vllm(tmp_path: Path, upstream: Callable[[str], Upstream]) -> Callable[..., Path]:
    """Factory: a fake `vllm` package reporting `version`, holding the real method of `body`.

    `body=None` leaves the method out (as from 0.29.0); `broken=True` makes the runner's
    module fail to import (as a GPU-less machine might).
    """

    def make(version: str, body: str | None = "0.26.0", *, broken: bool = False) -> Path:
        source = upstream(body) if body is not None else None
        return write_fake_vllm(
            tmp_path / f"vllm-{version}-{body}-{broken}",
            version,
            method=source.method_source if source else None,
            helper=source.helper_source("is_quantized_kv_cache") if source else None,
            broken=broken,
        )

    return make


@pytest.fixture
def plugin_entry_points(tmp_path: Path) -> Path:
    """A sys.path directory registering the plugin's entry points, as an install would."""
    return write_plugin_dist_info(tmp_path / "dist-info")


@pytest.fixture
def python() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a script in a fresh interpreter (fresh sys.modules, meta path and logging)."""
    return run_python
