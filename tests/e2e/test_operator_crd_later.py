"""An operator started before the InferenceModel CRD serves models once the CRD is installed,
without a restart and without rights to list CRDs (it reads the API's discovery)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import CRD, Cluster, wait_for
from processes import Process

from snooze.sandbox import Sandbox
from snooze.sim import SimulatorHost

LABELS = {"app": "chat"}


@pytest.fixture
def bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim: SimulatorHost) -> Iterator[Cluster]:
    """A sandbox without the CRD, as on a cluster where the operator came first."""
    with Sandbox() as sandbox:
        monkeypatch.setenv("KUBECONFIG", str(sandbox.write_kubeconfig(tmp_path / "kubeconfig")))
        cluster = Cluster(sandbox, sim)
        yield cluster
        cluster.close()


def test_operator_first_then_the_crd_then_a_model(bare: Cluster, tmp_path: Path) -> None:
    operator = Process(tmp_path / "operator.log", "operator", "--probe-interval", "0.2")
    try:
        wait_for(
            "the operator started without its CRD",
            lambda: "Unresolved resources cannot be served" in operator.output(),
            timeout=30,
        )
        created = httpx.post(
            f"{bare.sandbox.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            json=yaml.safe_load(CRD.read_text()),
        )
        assert created.status_code == 201, created.text
        bare.create_pod("chat-0", labels=LABELS)
        bare.create_model("chat", {"selector": {"matchLabels": LABELS}, "idle": {"after": "1s"}})
        # Served: its status written, its engine put to sleep when idle.
        wait_for("asleep", lambda: bare.pod_state("chat-0") == "asleep", timeout=30)
        wait_for("phase Asleep", lambda: bare.status("chat").get("phase") == "Asleep")
        assert operator.popen.poll() is None, "the same process serves it"
    finally:
        assert operator.stop() == 0, operator.output()[-3000:]
    assert "Traceback" not in operator.output()
