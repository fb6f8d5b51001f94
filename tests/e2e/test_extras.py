"""The product apart from its tools, from outside the process: a virtualenv with the base
install alone runs the operator and the gateway, holds neither kmock nor matplotlib, and
`snooze sandbox` and `snooze demo` each say in one line which pip command adds their extra;
the operator's image (its build context, as images/operator/Dockerfile.dockerignore keeps it)
holds what a cluster runs, the simulator included, and no sandbox or demo code."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import buildcontext
import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNS_IN_A_CLUSTER = ("operator", "gateway", "sim")


def run(*argv: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)


def source_tree(to: Path) -> Path:
    """What `pip install .` builds from a checkout: the package, its metadata and licence."""
    return buildcontext.copy(
        to,
        [
            name
            for name in buildcontext.tracked()
            if name.startswith(("operator/snooze/", "pyproject.toml", "README.md", "LICENSE"))
        ],
    )


def wheel(tree: Path, out: Path) -> Path:
    done = run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
               "-w", out, tree)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    [built] = out.glob("snooze-*.whl")
    return built


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with `pip install snooze` (no extra), from a wheel of this tree."""
    tmp = tmp_path_factory.mktemp("base")
    built = wheel(source_tree(tmp / "src"), tmp / "wheel")
    venv = tmp / "venv"
    assert run(sys.executable, "-m", "venv", venv).returncode == 0
    done = run(venv / "bin" / "pip", "install", "-q", "--disable-pip-version-check", built)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


def installed(venv: Path) -> set[str]:
    done = run(venv / "bin" / "pip", "list", "--format=freeze", "--disable-pip-version-check")
    return {line.split("==")[0].lower() for line in done.stdout.splitlines()}


def test_the_base_install_runs_the_operator_and_the_gateway_without_the_tools(
    base: Path,
) -> None:
    assert {"kopf", "aiohttp", "kubernetes"} <= installed(base)
    assert not {"kmock", "matplotlib"} & installed(base)
    snooze = base / "bin" / "snooze"
    listing = run(snooze, "--help")
    assert listing.returncode == 0, listing.stderr
    assert re.search(r"sandbox .*\(not installed here\)", " ".join(listing.stdout.split()))
    for command in (*RUNS_IN_A_CLUSTER, "crd", "whatif", "check"):
        done = run(snooze, command, "--help")
        assert done.returncode == 0 and "usage: snooze" in done.stdout, (command, done.stderr)


@pytest.mark.parametrize(
    ("argv", "extra", "lacking"),
    [
        (["sandbox"], "sandbox", "kmock"),
        (["sandbox", "--port", "0", "--help"], "sandbox", "kmock"),
        (["demo"], "demo", "matplotlib, kmock"),
        (["demo", "--duration", "5"], "demo", "matplotlib, kmock"),
    ],
)
def test_a_tool_without_its_extra_says_the_command_that_adds_it(
    base: Path, argv: list[str], extra: str, lacking: str
) -> None:
    done = run(base / "bin" / "snooze", *argv)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"snooze {argv[0]} needs the {extra} extra ({lacking} not installed)")
    # pip's own words for this install: the wheel it came from, with the extra.
    [command] = re.findall(r": (pip install '[^']+')$", line)
    assert re.fullmatch(rf"pip install '/\S+/snooze-[^/]+\.whl\[{extra}\]'", command), line


def test_whatif_without_matplotlib_writes_its_figures_and_says_what_draws_the_picture(
    base: Path, tmp_path: Path
) -> None:
    done = run(base / "bin" / "snooze", "whatif", "--trace", ROOT / "traces" / "weekly-mix.csv",
               "--policy", "always-on", "--out", tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "whatif.json").is_file() and not (tmp_path / "whatif.png").exists()
    [line] = [x for x in done.stderr.splitlines() if "matplotlib" in x]
    assert re.search(r"pip install '/\S+/snooze-[^/]+\.whl\[demo\]'", line), line


def test_the_image_holds_what_a_cluster_runs(base: Path, tmp_path: Path) -> None:
    """The image's `pip install .`, from the build context its .dockerignore keeps, into the
    same base virtualenv (its dependencies are the base install's)."""
    tree = buildcontext.image_context(tmp_path / "context")
    built = wheel(tree, tmp_path / "wheel")
    names = zipfile.ZipFile(built).namelist()
    for part in RUNS_IN_A_CLUSTER:
        assert f"snooze/{part}/__init__.py" in names, part
    assert not [n for n in names if n.startswith(("snooze/sandbox/", "snooze/demo/"))]
    # The licence goes wherever the package goes (a missing one is only a warning to setuptools).
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    done = run(base / "bin" / "pip", "install", "-q", "--no-deps", "--force-reinstall",
               "--disable-pip-version-check", built)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    snooze = base / "bin" / "snooze"
    for command in RUNS_IN_A_CLUSTER:
        done = run(snooze, command, "--help")
        assert done.returncode == 0, (command, done.stderr)
    for command in ("sandbox", "demo"):
        done = run(snooze, command)
        assert done.returncode == 2
        [line] = done.stderr.splitlines()
        assert line.startswith(f"snooze {command} is not part of this install"), line
        assert line.endswith(f"pip install -e '.[{command}]'"), line
