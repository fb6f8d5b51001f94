"""Commit subjects stay at most 72 characters (the detail goes in the body), from the commit
where the rule was set on; earlier history is as it was written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

# tests/needs.py: without git this fails, saying so; tests/run and .ci/run install it.
pytestmark = pytest.mark.needs("git")
ROOT = Path(__file__).resolve().parents[2]
# The last commit before the rule held for every commit; older subjects are left as they are.
RULE_FROM = "82baf7d3"
LONGEST = 72


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    )


def _subjects() -> list[str]:
    """The subjects since RULE_FROM; in a clone too shallow to hold it, HEAD's alone."""
    checkout = _git("rev-parse", "--git-dir")
    assert checkout.returncode == 0, f"the tests run from a git checkout: {checkout.stderr}"
    known = _git("cat-file", "-e", f"{RULE_FROM}^{{commit}}").returncode == 0
    span = [f"{RULE_FROM}..HEAD"] if known else ["-1", "HEAD"]
    listed = _git("log", "--format=%s", *span)
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.splitlines()


def test_every_subject_is_at_most_72_characters() -> None:
    long = [s for s in _subjects() if len(s) > LONGEST]
    assert not long, f"subjects over {LONGEST} characters (put the detail in the body): {long}"
