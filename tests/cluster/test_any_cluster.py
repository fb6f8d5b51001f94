"""The command of docs/testing.md that runs this tier on a cluster of one's own, run as printed,
with the harness's cluster standing in for the user's: a kubeconfig in $HOME/.kube/config, the
release installed already, and an image named as the user would name theirs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import docs_pages
import pytest
from controlplane import ROOT
from kube import Kube

PAGE = "docs/testing.md"
RECOVERY = "tests/cluster/test_recovery.py"
SECTION = "## The real control plane"


def page_command() -> str:
    [command] = docs_pages.commands(docs_pages.section(PAGE, SECTION))
    return command


@pytest.mark.local_only  # it runs the tier itself, on this cluster as if it were yours
def test_the_tier_runs_on_an_existing_cluster_as_the_docs_say(
    kube: Kube, release: str, tmp_path: Path
) -> None:
    command = page_command()
    assert command.startswith("SNOOZE_TEST_KUBECONFIG=$HOME/.kube/config ")
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    shutil.copy(kube.kubeconfig, home / ".kube" / "config")
    assert kube.local is not None and kube.local.control is not None
    # The user's own kubectl: here the one built with the control plane.
    path = f"{kube.local.control.bin}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "HOME": str(home), "PATH": path}
    env.pop("SNOOZE_TEST_IMAGE", None)
    # The faults of test_recovery.py have just run on this very cluster, with real SIGKILLs
    # (on a cluster of one's own a crash is a forced pod deletion): left out here, they keep
    # the tier within its ten minutes. Everything else runs a second time, as a user's would.
    env["PYTEST_ADDOPTS"] = f"--deselect {RECOVERY}"
    done = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200
    )
    shutil.rmtree("/tmp/snooze-test-gpu", ignore_errors=True)  # the pool test's hostPath
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    summary = done.stdout.splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    # What only this cluster can do was left out by name, not skipped quietly.
    assert "left out on an existing cluster (local_only)" in done.stdout
    assert "test_the_api_server_restarting_during_a_wake" in done.stdout
    assert "test_recovery.py ." not in done.stdout  # left out for time, as said above


README = "README.md"
README_SECTION = "## Tested on a real control plane"


def test_the_readme_prints_the_same_command_and_the_versions_built() -> None:
    """The README's command is the one the test above runs as printed, and the versions it
    names are those tests/k8s pins."""
    section = docs_pages.section(README, README_SECTION)
    assert docs_pages.commands(section) == [page_command()]
    pins = {
        "controlplane": r"k8s\.io/kubernetes v1\.(\d+\.\d+)",
        "etcd": r"go\.etcd\.io/etcd/server/v3 v(\S+)",
        "kwok": r"sigs\.k8s\.io/kwok v(\S+)",
    }
    found = {}
    for module, pattern in pins.items():
        match = re.search(pattern, (ROOT / "tests" / "k8s" / module / "go.mod").read_text())
        assert match, f"tests/k8s/{module}/go.mod pins no {pattern}"
        found[module] = match.group(1)
    said = " ".join(section.split())
    assert f"Kubernetes v1.{found['controlplane']}" in said
    assert f"etcd v{found['etcd']}" in said
    assert f"KWOK v{found['kwok']}" in said
