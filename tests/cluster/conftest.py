"""The cluster tier's fixtures: a real control plane (or the cluster SNOOZE_TEST_KUBECONFIG
names), the CRDs applied with kubectl, and the chart installed with real Helm.

On the harness's cluster the operator and the gateway run from this tree as the chart's pods,
with their service accounts' tokens; so does every simulated engine (the same image, `snooze
sim`). On an existing cluster, SNOOZE_TEST_IMAGE names an image built from
images/operator/Dockerfile that the cluster can pull.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docs_pages
import helm_python
import pytest
from cluster import IMAGE, LocalCluster
from controlplane import ROOT
from kube import Kube, wait_for

LEFT_OUT = pytest.StashKey[list[str]]()
RELEASE = "snooze"
SYSTEM = "snooze-system"
ENGINES = "llm"
"""The namespace of the tests' engines and models (the chart's NetworkPolicy covers it)."""
OTHER_TENANT = "llm-b"
CHART = ROOT / "charts" / "snooze"


def pytest_configure(config: pytest.Config) -> None:
    logging.getLogger("cluster").setLevel(logging.INFO)
    config.addinivalue_line(
        "markers",
        "local_only: needs the harness's own cluster (it restarts the API server, kills a "
        "process, upgrades the release); left out on an existing cluster",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an existing cluster, leave out what only the harness's own cluster can do, and say
    so: these are not skipped quietly, they are named in the summary."""
    if not os.environ.get("SNOOZE_TEST_KUBECONFIG"):
        return
    left_out = [item for item in items if item.get_closest_marker("local_only")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]
        config.stash[LEFT_OUT] = [item.nodeid for item in left_out]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    for nodeid in config.stash.get(LEFT_OUT, []):
        terminalreporter.write_line(f"left out on an existing cluster (local_only): {nodeid}")


@pytest.fixture(scope="session")
def kube() -> Iterator[Kube]:
    existing = os.environ.get("SNOOZE_TEST_KUBECONFIG")
    if existing:
        kubectl = shutil.which("kubectl")
        assert kubectl, "SNOOZE_TEST_KUBECONFIG is set but kubectl is not on PATH"
        view = Kube(Path(existing), kubectl=kubectl, local=None)
        yield view
        view.close()
        return
    local = LocalCluster(keep=bool(os.environ.get("SNOOZE_TEST_KEEP")))
    local.start()
    assert local.control is not None
    view = Kube(local.admin_kubeconfig, kubectl=str(local.control.bin / "kubectl"), local=local)
    try:
        yield view
    finally:
        view.close()
        local.stop()


def image() -> tuple[str, str]:
    """The image the chart and the engines run, as repository and tag."""
    name = os.environ.get("SNOOZE_TEST_IMAGE")
    if name is None:
        assert not os.environ.get("SNOOZE_TEST_KUBECONFIG"), (
            "SNOOZE_TEST_KUBECONFIG needs SNOOZE_TEST_IMAGE: the image built from "
            "images/operator/Dockerfile that your cluster can pull (REGISTRY/snooze:TAG)"
        )
        name = f"{IMAGE}:dev"
    repository, _, tag = name.rpartition(":")
    return repository, tag


INSTALL_PAGES = ["README.md", "docs/install.md", "charts/snooze/README.md"]


def apply_crds(kube: Kube) -> None:
    """The install pages' `kubectl apply -f crds/`, each run as printed through bash from the
    repository's root, with this cluster's kubeconfig and kubectl (the install's other
    commands need a registry, or are Helm's: tests/chart/test_install_docs.py runs those)."""
    kubectl_dir = str(Path(kube.kubectl_path).parent)
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "KUBECACHEDIR": str(kube.cache)}
    env["PATH"] = f"{kubectl_dir}{os.pathsep}{os.environ['PATH']}"
    for page in INSTALL_PAGES:
        [line] = [c for c in docs_pages.commands(docs_pages.read(page)) if "crds/" in c]
        assert line.split("#")[0].split() == ["kubectl", "apply", "-f", "crds/"], (page, line)
        done = subprocess.run(
            ["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (page, done.stderr)
        for crd in ("inferencemodels.snooze.dev", "gpupools.snooze.dev"):
            assert crd in done.stdout, (page, done.stdout)


@pytest.fixture(scope="session")
def crds(kube: Kube) -> None:
    """The CRDs, applied with kubectl as the install pages print it, and the engines'
    namespaces."""
    apply_crds(kube)
    for name in ("inferencemodels.snooze.dev", "gpupools.snooze.dev"):
        # Not `kubectl wait`: it fails on a CRD whose status has no conditions yet.
        wait_for(
            f"{name} to be established",
            lambda name=name: any(
                c["type"] == "Established" and c["status"] == "True"
                for c in kube.get("crd", name).get("status", {}).get("conditions") or []
            ),
        )
    # The API server publishes a new CRD's OpenAPI a moment after it is established.
    wait_for(
        "the CRDs' OpenAPI",
        lambda: (
            kube.kubectl("explain", "inferencemodel", check=False).returncode == 0
            and kube.kubectl("explain", "gpupool", check=False).returncode == 0
        ),
    )
    for namespace in (ENGINES, OTHER_TENANT):
        kube.kubectl("create", "namespace", namespace, check=False)


def release_values() -> dict[str, Any]:
    repository, tag = image()
    return {
        "image": {"repository": repository, "tag": tag},
        "operator": {"probeInterval": "2s"},
        "networkPolicy": {"enabled": True, "namespaces": [ENGINES, OTHER_TENANT]},
        # The operator reads the endpoint pickers' queues (test_inference_gateway.py).
        "inferenceGateway": {"enabled": True},
    }


@pytest.fixture(scope="session")
def release(kube: Kube, crds: None) -> Iterator[str]:
    """The chart, installed with Helm as RELEASE into SYSTEM; on an existing cluster where
    that release is installed already (yours), that one, left as it is."""
    with helm_python.Config(kubeconfig_path=str(kube.kubeconfig), namespace=SYSTEM) as helm:
        if kube.local is None and any(r["name"] == RELEASE for r in helm.list()):
            yield RELEASE
            return
        helm.install(
            str(CHART), RELEASE, release_values(), namespace=SYSTEM, create_namespace=True,
            wait="watcher", timeout=180,
        )  # fmt: skip
        try:
            yield RELEASE
        finally:
            helm.uninstall(RELEASE, wait="watcher", timeout=120, ignore_not_found=True)


@pytest.fixture
def operator_pod(kube: Kube, release: str) -> object:
    pods = wait_for(
        "the operator's pod",
        lambda: kube.ready_pods(SYSTEM, "app.kubernetes.io/component=operator"),
    )
    return pods[0]


@pytest.fixture
def gateway_pod(kube: Kube, release: str) -> object:
    pods = wait_for(
        "the gateway's pod",
        lambda: kube.ready_pods(SYSTEM, "app.kubernetes.io/component=gateway"),
    )
    return pods[0]
