"""The InferenceModel CRD deleted and installed again while the operator runs (a reinstall, by
`kubectl delete -f crds/` then `kubectl apply -f crds/`): a model created after it is served by
the same process, without a restart."""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml
from processes import Process
from waits import wait_for

from snooze.api import models

from .conftest import CRD, Cluster
from .test_operator_crd_later import POOL_CRD, bare

__all__ = ["bare"]
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def served(url: str) -> bool:
    """InferenceModels are in the group's discovery (the GPUPool CRD keeps the group itself)."""
    found = httpx.get(f"{url}/apis/{models.GROUP}/{models.VERSION}")
    return found.status_code == 200 and any(
        r.get("name") == models.PLURAL for r in found.json().get("resources", [])
    )


def test_a_model_after_the_crd_is_deleted_and_installed_again(
    bare: Cluster, tmp_path: Path
) -> None:
    url = bare.sandbox.url
    crd = yaml.safe_load(CRD.read_text())
    assert httpx.post(f"{url}{CRDS}", json=crd).status_code == 201
    pools = yaml.safe_load(POOL_CRD.read_text())
    assert httpx.post(f"{url}{CRDS}", json=pools).status_code == 201  # as crds/ installs both
    operator = Process(tmp_path / "operator.log", "operator", "--probe-interval", "0.2")
    try:
        bare.create_pod("chat-0", labels={"app": "chat"})
        bare.create_model(
            "chat", {"selector": {"matchLabels": {"app": "chat"}}, "idle": {"after": "1s"}}
        )
        wait_for("chat asleep", lambda: bare.pod_state("chat-0") == "asleep", timeout=30)

        deleted = httpx.delete(f"{url}{CRDS}/{models.PLURAL}.{models.GROUP}")
        assert deleted.status_code in (200, 202), deleted.text
        wait_for("the CRD gone", lambda: not served(url), timeout=30)
        assert httpx.post(f"{url}{CRDS}", json=crd).status_code == 201

        bare.create_pod("code-0", labels={"app": "code"})
        bare.create_model(
            "code", {"selector": {"matchLabels": {"app": "code"}}, "idle": {"after": "1s"}}
        )
        wait_for("code asleep", lambda: bare.pod_state("code-0") == "asleep", timeout=60)
        wait_for("its status", lambda: bare.status("code").get("phase") == "Asleep")
        assert operator.popen.poll() is None, "the same process serves it"
    finally:
        assert operator.stop() == 0, operator.output()[-3000:]
    assert "Traceback" not in operator.output()
