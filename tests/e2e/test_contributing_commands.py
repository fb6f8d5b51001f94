"""CONTRIBUTING.md's commands for one test file and one tier, run as printed from the
repository's root (here, where a tier's timings have the machine to themselves)."""

from __future__ import annotations

import re
import subprocess

import docs_pages
import pytest

PAGE = "CONTRIBUTING.md"
[ONE_FILE_OR_TIER] = [
    b for b in docs_pages.command_blocks(docs_pages.section(PAGE, "## Run the tests"))
    if "pytest" in b.body and "lint-imports" not in b.body
]  # fmt: skip


@pytest.mark.parametrize("command", ONE_FILE_OR_TIER.body.split("\n")[:-1])
def test_one_file_or_one_tier_runs_as_printed(command: str) -> None:
    done = subprocess.run(
        ["bash", "-c", command], cwd=docs_pages.ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary, summary
