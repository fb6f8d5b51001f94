"""`kubectl get -w` against the sandbox: every row a watch prints has the list's columns."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from snooze.sandbox import Sandbox

pytestmark = pytest.mark.needs("kubectl")

CRD = Path(__file__).parents[2] / "crds" / "inferencemodels.snooze.dev.yaml"


class Watch:
    """A `kubectl get ... -w` running in the background, its output read line by line."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.process = subprocess.Popen(
            ["kubectl", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, wanted: Callable[[list[str]], bool], timeout: float = 30) -> list[str]:
        """The first line whose words satisfy `wanted`; fails with all lines seen otherwise."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if wanted(line.split()):
                return line.split()
        raise AssertionError(f"no such line from kubectl; it printed: {self.seen}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture
def kubectl_env(sandbox: Sandbox, tmp_path: Path) -> dict[str, str]:
    config = sandbox.write_kubeconfig(tmp_path / "kubeconfig")
    return {**os.environ, "KUBECONFIG": str(config), "KUBECACHEDIR": str(tmp_path / "cache")}


@pytest.fixture
def watch(kubectl_env: dict[str, str]) -> Iterator[Callable[..., Watch]]:
    started: list[Watch] = []

    def start(*args: str) -> Watch:
        started.append(Watch(list(args), kubectl_env))
        return started[-1]

    yield start
    for w in started:
        w.stop()


def patch_status(sandbox: Sandbox, path: str, status: dict[str, object]) -> None:
    response = httpx.patch(
        f"{sandbox.url}{path}/status",
        content=json.dumps({"status": status}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert response.status_code == 200, response.text


def test_pod_watch_rows_keep_the_columns(sandbox: Sandbox, watch: Callable[..., Watch]) -> None:
    pods = f"{sandbox.url}/api/v1/namespaces/default/pods"
    pod = {
        "metadata": {"name": "watched", "labels": {"tier": "a"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    assert httpx.post(pods, json=pod).status_code == 201
    w = watch("get", "pods", "-L", "tier", "-w")
    assert w.wait_for(lambda words: words[:1] == ["NAME"]) == [
        "NAME", "READY", "STATUS", "RESTARTS", "AGE", "TIER"
    ]  # fmt: skip
    assert w.wait_for(lambda words: words[:1] == ["watched"])[1] == "0/1"
    # What a kubelet writes once the container runs and passes its readiness probe.
    patch_status(
        sandbox,
        "/api/v1/namespaces/default/pods/watched",
        {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {"name": "c", "ready": True, "restartCount": 0, "state": {"running": {}}}
            ],
        },
    )
    row = w.wait_for(lambda words: words[:1] == ["watched"])
    assert row[:4] == ["watched", "1/1", "Running", "0"] and row[-1] == "a"
    relabel = {"metadata": {"labels": {"tier": "b"}}}
    headers = {"Content-Type": "application/merge-patch+json"}
    assert httpx.patch(f"{pods}/watched", json=relabel, headers=headers).status_code == 200
    assert w.wait_for(lambda words: words[:1] == ["watched"])[-1] == "b"  # -L reads each row
    httpx.delete(f"{pods}/watched")


def test_custom_resource_watch_shows_printer_columns(
    sandbox: Sandbox, watch: Callable[..., Watch]
) -> None:
    crds = f"{sandbox.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    assert httpx.post(crds, json=yaml.safe_load(CRD.read_text())).status_code == 201
    models = f"{sandbox.url}/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels"
    model = {
        "apiVersion": "snooze.dev/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": "watched"},
        "spec": {"selector": {"matchLabels": {"app": "watched"}}},
    }
    assert httpx.post(models, json=model).status_code == 201
    w = watch("get", "im", "-w")
    header = w.wait_for(lambda words: words[:1] == ["NAME"])
    assert header[:3] == ["NAME", "MODEL", "PHASE"]
    w.wait_for(lambda words: words[:1] == ["watched"])
    path = "/apis/snooze.dev/v1alpha1/namespaces/default/inferencemodels/watched"
    for phase in ("Awake", "Asleep"):
        patch_status(
            sandbox, path, {"phase": phase, "modelName": "chat", "awake": int(phase == "Awake")}
        )
        row = w.wait_for(lambda words: words[:1] == ["watched"])
        assert row[1:4] == ["chat", phase, str(int(phase == "Awake"))]
    assert [line.split()[0] for line in w.seen].count("NAME") == 1  # one header, as on a cluster
    assert httpx.delete(f"{crds}/inferencemodels.snooze.dev").status_code == 200
