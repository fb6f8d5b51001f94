"""An operator started before its CRDs serves models, then pools, as each CRD is installed,
without a restart of its process and without rights to list CRDs (it reads the API's
discovery), and says so without kopf's warning that they "cannot be served"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from builders import gpu_pool
from processes import Process
from waits import wait_for

from snooze.sandbox import Sandbox
from snooze.sim import SimulatorHost

from .conftest import CRD, Cluster

LABELS = {"app": "chat"}


@pytest.fixture
def bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim: SimulatorHost) -> Iterator[Cluster]:
    """A sandbox without the CRD, as on a cluster where the operator came first."""
    with Sandbox() as sandbox:
        monkeypatch.setenv("KUBECONFIG", str(sandbox.write_kubeconfig(tmp_path / "kubeconfig")))
        cluster = Cluster(sandbox, sim)
        yield cluster
        cluster.close()


POOL_CRD = CRD.parent / "gpupools.snooze.dev.yaml"
POOLS = "/apis/snooze.dev/v1alpha1/namespaces/default/gpupools"


def install(cluster: Cluster, crd: Path) -> None:
    created = httpx.post(
        f"{cluster.sandbox.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        json=yaml.safe_load(crd.read_text()),
    )
    assert created.status_code == 201, created.text


def test_operator_first_then_the_crd_then_a_model(bare: Cluster, tmp_path: Path) -> None:
    operator = Process(tmp_path / "operator.log", "operator", "--probe-interval", "0.2")
    try:
        wait_for(
            "the operator started without its CRDs",
            lambda: (
                "InferenceModels and GPUPools are served once their CRDs are installed "
                "(kubectl apply -f crds/)" in operator.output()
            ),
            timeout=30,
        )
        install(bare, CRD)
        bare.create_pod("chat-0", labels=LABELS)
        bare.create_model("chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "1s"}})
        # Served: its status written, its engine put to sleep when idle.
        wait_for("asleep", lambda: bare.pod_state("chat-0") == "asleep", timeout=30)
        wait_for("phase Asleep", lambda: bare.status("chat").get("phase") == "Asleep")
        wait_for(
            "the wait for the other CRD",
            lambda: "GPUPools are served once their CRD is installed" in operator.output(),
        )

        # The GPUPool CRD comes later still (an upgrade that adds it): pools are served too.
        install(bare, POOL_CRD)
        bare.http.post(POOLS, json=gpu_pool()).raise_for_status()
        wait_for(
            "the pool's status",
            lambda: (
                bare.http.get(f"{POOLS}/gpu-0").json().get("status", {}).get("memoryBytes")
                == 70 * 2**30
            ),
            timeout=30,
        )
        wait_for("the model still served", lambda: bare.status("chat").get("phase") == "Asleep")
        assert operator.popen.poll() is None, "the same process serves it"
    finally:
        assert operator.stop() == 0, operator.output()[-3000:]
    said = operator.output()
    assert "Traceback" not in said
    assert "Unresolved resources" not in said, said
