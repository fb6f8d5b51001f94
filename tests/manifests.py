"""Manifests checked offline as a Kubernetes release's API server would check their built-in
kinds: kubernetes-validate, strict (unknown fields refused)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path


def validate_strict(files: Iterable[Path], kubernetes: str) -> str:
    """kubernetes-validate --strict of these files for that release; fails the test unless every
    object it knows passes, and returns what it printed (it names the kinds it has no schema
    of, and each object that passed)."""
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", kubernetes,
         *map(str, files)],
        capture_output=True,
        text=True,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output
