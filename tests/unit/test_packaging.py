"""Packaging: one version, a build backend that reads the licence field, the licence itself."""

from __future__ import annotations

import email
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

import snooze

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_has_one_source() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project, "the version lives in snooze/__init__.py only"
    assert "version" in project["dynamic"]
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "snooze.__version__"}


def test_the_chart_and_the_install_commands_carry_the_version() -> None:
    """The chart's appVersion (its default image tag) and the README's image tags are copies
    of the package's version: a release that bumps one bumps them all, or this fails."""
    chart = yaml.safe_load((ROOT / "charts" / "snooze" / "Chart.yaml").read_text())
    assert chart["appVersion"] == snooze.__version__
    readme = (ROOT / "README.md").read_text()
    tags = re.findall(r"(?:snooze:|image\.tag=)([0-9][^\s`]*)", readme)
    assert tags and set(tags) == {snooze.__version__}, tags
    dockerfile = (ROOT / "images" / "operator" / "Dockerfile").read_text()
    assert set(re.findall(r"/snooze:([0-9][^\s`]*)", dockerfile)) == {snooze.__version__}


def test_the_build_backend_reads_an_spdx_licence() -> None:
    # setuptools reads `license = "Apache-2.0"` (PEP 639) from 77 on; older ones refuse it.
    [setuptools] = [
        Requirement(r) for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")
    ]
    assert not setuptools.specifier.contains("76.1"), setuptools
    assert setuptools.specifier.contains("77.0")


def test_built_metadata_carries_the_version_and_licence(tmp_path: Path) -> None:
    """What pip and PyPI would see: the metadata the build backend writes for a wheel."""
    script = (
        "import sys; from setuptools import build_meta; "
        "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    info = tmp_path / result.stdout.strip().splitlines()[-1]
    metadata = email.message_from_string((info / "METADATA").read_text())
    assert metadata["Version"] == snooze.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License-File"] == "LICENSE"


def test_the_licence_is_apache_2() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_demo_output_is_ignored() -> None:
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "snooze-demo/" in ignored
